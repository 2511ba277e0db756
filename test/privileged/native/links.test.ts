// bpf_link through the addon: a cgroup/connect4 program attached to a
// temporary cgroup counts a real connect made from inside it; the link is
// inspected, its program swapped in place, pinned and detached. An sk_lookup
// program is linked to a temporary netns.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { statSync } from 'node:fs';
import path from 'node:path';
import * as bpf from '../../../src/native/addon.js';
import { NativeError } from '../../../src/native/errors.js';
import {
  cleanupsAfterEach,
  compileFixture, connectFromCgroup, loopbackListener, makeCgroup, makeNetns, removeCgroup,
  removeDir, removeNetns, tempDir, tempPinDir, u32,
} from './kernel-env.js';

let work: string;
let counter: bpf.BpfObject | undefined;
let skLookup: bpf.BpfObject | undefined;
let countFd: number;
let altFd: number;
let countsFd: number;
let passAllFd: number;
let listener: { port: number; close: () => Promise<void> } | undefined;

beforeAll(async () => {
  work = tempDir();
  counter = bpf.openObject(await compileFixture(work, 'counter'));
  await counter.load();
  skLookup = bpf.openObject(await compileFixture(work, 'sk_lookup'));
  await skLookup.load();
  const progs = counter.programs();
  countFd = progs.find((p) => p.name === 'connect4_count')!.fd;
  altFd = progs.find((p) => p.name === 'connect4_alt')!.fd;
  countsFd = counter.maps().find((m) => m.name === 'counts')!.fd;
  passAllFd = skLookup.programs()[0]!.fd;
  listener = await loopbackListener();
});
afterAll(async () => {
  counter?.close();
  skLookup?.close();
  await listener?.close();
  removeDir(work);
});

const cleanups = cleanupsAfterEach();

const count = (): bigint => bpf.mapLookup(countsFd, u32(listener!.port), 8)?.readBigUInt64LE() ?? 0n;

describe('cgroup links', () => {
  it('attach, observe a real connect, inspect, update in place, pin, detach', async () => {
    const cg = makeCgroup();
    cleanups.push(() => removeCgroup(cg));
    const port = listener!.port;
    bpf.mapDelete(countsFd, u32(port));

    const link = bpf.linkCreateCgroup(countFd, cg, bpf.consts.attachType.CGROUP_INET4_CONNECT);
    cleanups.push(() => bpf.closeFd(link));
    await connectFromCgroup(cg, port);
    expect(count()).toBe(1n);

    const info = bpf.linkInfo(link);
    expect(info.type).toBe(bpf.consts.linkType.CGROUP);
    expect(info.attachType).toBe(bpf.consts.attachType.CGROUP_INET4_CONNECT);
    expect(info.progId).toBe(bpf.progInfo(countFd).id);
    // A cgroup v2 id is the inode number of its directory.
    expect(info.cgroupId).toBe(statSync(cg, { bigint: true }).ino);
    expect(info.netnsIno).toBeNull();

    // Swap in connect4_alt (+1000) without re-attaching: same link id.
    bpf.linkUpdate(link, altFd, countFd);
    const after = bpf.linkInfo(link);
    expect(after.id).toBe(info.id);
    expect(after.progId).toBe(bpf.progInfo(altFd).id);
    await connectFromCgroup(cg, port);
    expect(count()).toBe(1001n);

    // BPF_F_REPLACE with a stale old program is refused.
    expect(() => bpf.linkUpdate(link, countFd, countFd)).toThrow(NativeError);
    expect(() => bpf.linkUpdate(link, countFd, countFd)).toThrow(expect.objectContaining({ code: 'EPERM', syscall: 'bpf_link_update' }));
    expect(bpf.linkInfo(link).progId).toBe(bpf.progInfo(altFd).id);

    // Pin the link and get it back by path.
    const pins = tempPinDir();
    cleanups.push(() => removeDir(pins));
    bpf.objPin(link, path.join(pins, 'link'));
    const again = bpf.objGet(path.join(pins, 'link'));
    cleanups.push(() => bpf.closeFd(again));
    expect(bpf.linkInfo(again).id).toBe(info.id);

    // Detach: the program stops running though the link fd and pin remain.
    bpf.linkDetach(link);
    await connectFromCgroup(cg, port);
    expect(count()).toBe(1001n);
  });

  it('names the cgroup when attaching fails', () => {
    const missing = path.join(work, 'not-a-cgroup');
    expect(() => bpf.linkCreateCgroup(countFd, missing, bpf.consts.attachType.CGROUP_INET4_CONNECT)).toThrow(
      expect.objectContaining({ code: 'ENOENT', syscall: 'open', object: missing }),
    );
    // wrong attach type for this program
    const cg = makeCgroup();
    cleanups.push(() => removeCgroup(cg));
    expect(() => bpf.linkCreateCgroup(countFd, cg, bpf.consts.attachType.CGROUP_INET6_CONNECT)).toThrow(
      expect.objectContaining({ code: 'EINVAL', syscall: 'bpf_link_create', object: cg }),
    );
  });

  it('linkInfo/progInfo refuse fds of the wrong kind', () => {
    expect(() => bpf.linkInfo(countFd)).toThrow(/linkInfo: fd \d+ is not a bpf-link \(it is anon_inode:bpf-prog\)/);
    expect(() => bpf.progInfo(countsFd)).toThrow(TypeError);
  });
});

describe('netns links', () => {
  let ns: { name: string; path: string } | undefined;
  afterAll(() => removeNetns(ns?.name));

  it('links an sk_lookup program to a netns', async () => {
    ns = await makeNetns();
    const link = bpf.linkCreateNetns(passAllFd, ns.path, bpf.consts.attachType.SK_LOOKUP);
    cleanups.push(() => bpf.closeFd(link));
    const info = bpf.linkInfo(link);
    expect(info.type).toBe(bpf.consts.linkType.NETNS);
    expect(info.attachType).toBe(bpf.consts.attachType.SK_LOOKUP);
    expect(info.netnsIno).toBe(statSync(ns.path).ino);
    expect(info.cgroupId).toBeNull();
    expect(info.progId).toBe(bpf.progInfo(passAllFd).id);
    bpf.linkDetach(link);
  });
});
