// BpfObject against the real kernel: open/load, programs()/maps(), setRodata
// reaching the datapath, verifier rejection, map pinning via mapPinDir.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import path from 'node:path';
import * as bpf from '../../../src/native/addon.js';
import { NativeError } from '../../../src/native/errors.js';
import {
  cleanupsAfterEach,
  compileFixture, connectFromCgroup, loopbackListener, makeCgroup, removeCgroup, removeDir,
  tempDir, tempPinDir, u32,
} from './kernel-env.js';

let work: string;
let counterObj: string;
let counterSmallObj: string;
let rejectedObj: string;

beforeAll(async () => {
  work = tempDir();
  [counterObj, counterSmallObj, rejectedObj] = await Promise.all([
    compileFixture(work, 'counter'),
    compileFixture(work, 'counter', ['COUNTS_MAX=64'], 'counter-small'),
    compileFixture(work, 'rejected'),
  ]);
});
afterAll(() => removeDir(work));

// Every object/link/cgroup/pin a test makes is registered here and undone in
// afterEach, also when the test failed half-way.
const cleanups = cleanupsAfterEach();
function open(p: string, opts?: bpf.OpenObjectOptions): bpf.BpfObject {
  const o = bpf.openObject(p, opts);
  cleanups.push(() => o.close());
  return o;
}

describe('openObject + load', () => {
  it('lists programs and maps before and after load', async () => {
    const o = open(counterObj);
    expect(o.path).toBe(counterObj);
    const before = o.programs();
    expect(before.map((p) => p.name).sort()).toEqual(['connect4_alt', 'connect4_count']);
    for (const p of before) {
      expect(p).toMatchObject({
        section: 'cgroup/connect4',
        type: bpf.consts.progType.CGROUP_SOCK_ADDR,
        expectedAttachType: bpf.consts.attachType.CGROUP_INET4_CONNECT,
        fd: -1,
      });
    }
    const counts = o.maps().find((m) => m.name === 'counts');
    expect(counts).toEqual({ name: 'counts', type: bpf.consts.mapType.HASH, keySize: 4, valueSize: 8, maxEntries: 128, fd: -1, pinPath: null });

    await o.load();
    const progs = o.programs();
    for (const p of progs) {
      expect(p.fd).toBeGreaterThan(2);
      const info = bpf.progInfo(p.fd);
      expect(info.name).toBe(p.name);
      expect(info.type).toBe(bpf.consts.progType.CGROUP_SOCK_ADDR);
      expect(info.tag).toMatch(/^[0-9a-f]{16}$/);
      expect(info.id).toBeGreaterThan(0);
    }
    const m = o.maps().find((x) => x.name === 'counts')!;
    expect(bpf.mapInfo(m.fd)).toMatchObject({ name: 'counts', type: bpf.consts.mapType.HASH, keySize: 4, valueSize: 8, maxEntries: 128 });
  });

  it('refuses a second load and calls after close with a clear error', async () => {
    const o = open(counterObj);
    await o.load();
    expect(() => o.load()).toThrow(/load\(\) is not allowed when the object is loaded/);
    expect(() => o.setRodata('step', u32(2))).toThrow(/setRodata\(\) is not allowed/);
    o.close();
    o.close(); // idempotent
    expect(() => o.programs()).toThrow(/closed/);
  });

  it('openObject of a missing file is a NativeError ENOENT naming the path', () => {
    const missing = path.join(work, 'nope.bpf.o');
    expect(() => bpf.openObject(missing)).toThrow(NativeError);
    try {
      bpf.openObject(missing);
    } catch (e) {
      expect(e).toMatchObject({ code: 'ENOENT', syscall: 'bpf_object__open_file', object: missing });
    }
  });

  it('rejects a verifier-rejected program with the verifier log', async () => {
    const o = open(rejectedObj);
    const err = await o.load().then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(NativeError);
    const ne = err as NativeError;
    expect(ne.code).toBe('EACCES');
    expect(ne.syscall).toBe('bpf_object__load');
    expect(ne.object).toBe(`prog 'unchecked_lookup' of ${rejectedObj}`);
    expect(ne.log).toContain('-- BEGIN PROG LOAD LOG --');
    expect(ne.log).toContain("invalid mem access 'map_value_or_null'");
    expect(ne.message).toContain("R0 invalid mem access 'map_value_or_null'");
    expect(o.programs()[0]!.fd).toBe(-1);
  });
});

describe('concurrent loads', () => {
  it('keep their libbpf logs apart', async () => {
    const bad = open(rejectedObj);
    const good = open(counterObj);
    const [r1, r2] = await Promise.allSettled([bad.load(), good.load()]);
    expect(r2.status).toBe('fulfilled');
    expect(r1.status).toBe('rejected');
    const log = ((r1 as PromiseRejectedResult).reason as NativeError).log!;
    expect(log).toContain("prog 'unchecked_lookup'");
    expect(log).not.toContain('connect4_count');
  });
});

describe('setRodata', () => {
  it('checks the variable name and size', () => {
    const o = open(counterObj);
    expect(() => o.setRodata('no_such_var', u32(1))).toThrow(/variable 'no_such_var' not found in \.rodata/);
    expect(() => o.setRodata('step', Buffer.alloc(8))).toThrow(TypeError);
    expect(() => o.setRodata('step', Buffer.alloc(8))).toThrow(/'step' is 4 bytes, value is 8 bytes/);
  });

  it('changes what the loaded program does', async () => {
    const cg = makeCgroup();
    cleanups.push(() => removeCgroup(cg));
    const listener = await loopbackListener();
    cleanups.push(() => listener.close());

    const o = open(counterObj);
    o.setRodata('step', u32(7));
    await o.load();
    const prog = o.programs().find((p) => p.name === 'connect4_count')!;
    const counts = o.maps().find((m) => m.name === 'counts')!;
    const link = bpf.linkCreateCgroup(prog.fd, cg, bpf.consts.attachType.CGROUP_INET4_CONNECT);
    cleanups.push(() => bpf.closeFd(link));

    await connectFromCgroup(cg, listener.port);
    await connectFromCgroup(cg, listener.port);
    expect(bpf.mapLookup(counts.fd, u32(listener.port), 8)?.readBigUInt64LE()).toBe(14n);
  });
});

describe('mapPinDir', () => {
  it('pins maps, reuses a compatible pinned map, rejects an incompatible one naming it', async () => {
    const pins = tempPinDir();
    cleanups.push(() => removeDir(pins));
    const pinDir = path.join(pins, 'maps'); // libbpf creates the last path component

    const first = open(counterObj, { mapPinDir: pinDir });
    const declared = first.maps();
    expect(declared.find((m) => m.name === 'counts')!.pinPath).toBe(path.join(pinDir, 'counts'));
    // .rodata holds per-load config and is never pinned (a reused frozen copy would ignore setRodata).
    expect(declared.find((m) => m.name.endsWith('.rodata'))!.pinPath).toBeNull();
    await first.load();
    const fd1 = first.maps().find((m) => m.name === 'counts')!.fd;
    const id1 = bpf.mapInfo(fd1).id;
    bpf.mapUpdate(fd1, u32(9), Buffer.from('0102030405060708', 'hex'));
    first.close();

    const pinned = bpf.objGet(path.join(pinDir, 'counts'));
    cleanups.push(() => bpf.closeFd(pinned));
    expect(bpf.mapInfo(pinned).id).toBe(id1);

    const second = open(counterObj, { mapPinDir: pinDir });
    await second.load();
    const fd2 = second.maps().find((m) => m.name === 'counts')!.fd;
    expect(bpf.mapInfo(fd2).id).toBe(id1);
    expect(bpf.mapLookup(fd2, u32(9), 8)?.toString('hex')).toBe('0102030405060708');

    const incompatible = open(counterSmallObj, { mapPinDir: pinDir });
    const err = await incompatible.load().then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(NativeError);
    expect((err as NativeError).object).toBe(`map 'counts' of ${counterSmallObj}`);
    expect((err as NativeError).message).toMatch(/map 'counts'.*different type\/key\/value\/max_entries/);
    expect((err as NativeError).log).toContain('parameter mismatch');
  });
});
