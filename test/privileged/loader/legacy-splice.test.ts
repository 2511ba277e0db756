// A node upgraded from a meshcap that had the sk_msg splice (removed in issue
// 20) still has its pins: mc_splice with the mc_splice_msg verdict attached,
// mc_splice_ref, mc_settings. `meshcap load` unpins them (a connection still
// spliced keeps working and keeps its verdict until it closes), and
// `meshcap uninstall` sweeps them with the rest. bpftool is the observer.
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { execa } from 'execa';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { loadDatapath, uninstallDatapath } from '../../../src/loader/datapath.js';
import { LEGACY_MAPS, pinLayout } from '../../../src/loader/manifest.js';
import { projectRoot } from '../../../src/paths.js';
import * as bpf from '../../../src/native/addon.js';
import { describeEbpf } from '../../helpers/datapaths.js';
import { testPinRoot } from '../../helpers/lab.js';

const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-legacy-splice-'));
const fixture = path.join(tmp, 'old-splice.bpf.o');
const roots: string[] = [];
const sockets: net.Socket[] = [];
let server: net.Server | undefined;

beforeAll(async () => {
  await execa('clang', ['-target', 'bpf', '-O2', '-g', '-I', path.join(projectRoot, 'build/bpf'), '-idirafter', '/usr/include/x86_64-linux-gnu',
    '-c', path.join(projectRoot, 'test/privileged/loader/fixtures/old-splice.bpf.c'), '-o', fixture]);
});
afterEach(() => {
  for (const s of sockets.splice(0)) s.destroy();
  server?.close();
  server = undefined;
  for (const r of roots.splice(0)) if (existsSync(r)) uninstallDatapath(r);
});
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const spliceProgs = async (id: number) =>
  (JSON.parse((await execa('bpftool', ['-j', 'prog', 'show'])).stdout || '[]') as { id: number; type: string }[]).filter((p) => p.id === id);

/** A loopback TCP connection of this process: [client, accepted]. */
async function connection(): Promise<[net.Socket, net.Socket]> {
  const accepted = new Promise<net.Socket>((res) => {
    server = net.createServer((s) => res(s));
  });
  await new Promise<void>((res) => server!.listen(0, '127.0.0.1', res));
  const client = net.connect((server!.address() as net.AddressInfo).port, '127.0.0.1');
  await new Promise<void>((res, rej) => client.once('connect', res).once('error', rej));
  const peer = await accepted;
  sockets.push(client, peer);
  return [client, peer];
}

/**
 * Pin what an older meshcap pinned for the splice under root/maps, attach the
 * verdict to mc_splice and, if given, put a live socket into it (as its
 * sockops did). Returns the verdict's program id.
 */
async function pinOldSplice(root: string, live?: net.Socket): Promise<number> {
  mkdirSync(pinLayout(root).maps, { recursive: true });
  const obj = bpf.openObject(fixture, { mapPinDir: pinLayout(root).maps });
  try {
    await obj.load();
    const prog = obj.programs().find((p) => p.name === 'mc_splice_msg')!;
    const map = bpf.objGet(path.join(pinLayout(root).maps, 'mc_splice'));
    try {
      bpf.progAttach(prog.fd, map, bpf.consts.attachType.SK_MSG_VERDICT!);
      if (live) {
        const fd = (live as unknown as { _handle: { fd: number } })._handle.fd;
        const value = Buffer.alloc(8);
        value.writeBigUInt64LE(BigInt(fd));
        bpf.mapUpdate(map, Buffer.alloc(48, 1), value);
      }
    } finally {
      bpf.closeFd(map);
    }
    return bpf.progInfo(prog.fd).id;
  } finally {
    obj.close(); // from here only the map holds the verdict, as after the old load
  }
}

/** Bytes written on one end arrive on the other, in order. */
async function echoes(from: net.Socket, to: net.Socket, data: string): Promise<string> {
  let got = '';
  const done = new Promise<void>((res) => {
    const on = (b: Buffer) => {
      got += b.toString();
      if (got.length >= data.length) {
        to.off('data', on);
        res();
      }
    };
    to.on('data', on);
  });
  from.write(data);
  await Promise.race([done, new Promise((r) => setTimeout(r, 5000))]);
  return got;
}

describeEbpf('pins of an older meshcap\'s splice (issue 20)', () => {
  it('meshcap load unpins them; a connection still spliced keeps flowing, and the verdict goes when it closes', async () => {
    const root = testPinRoot();
    roots.push(root);
    const [client, peer] = await connection();
    const verdict = await pinOldSplice(root, client);
    expect(await spliceProgs(verdict)).toHaveLength(1);
    const r = await loadDatapath({ pinRoot: root });
    expect(r.removedLegacy.sort()).toEqual(LEGACY_MAPS.map((m) => path.join(pinLayout(root).maps, m)).sort());
    for (const m of LEGACY_MAPS) expect(readdirSync(pinLayout(root).maps)).not.toContain(m);
    // the spliced socket still has its psock and verdict: bytes still pass, in order
    const payload = Array.from({ length: 3000 }, (_, i) => String(i % 10)).join('');
    expect(await echoes(client, peer, payload)).toBe(payload);
    expect(await spliceProgs(verdict), 'the live spliced socket keeps its verdict').toHaveLength(1);
    client.destroy();
    peer.destroy();
    await expect.poll(() => spliceProgs(verdict), { timeout: 10_000 }).toEqual([]);
    // a second load finds nothing left to remove
    expect((await loadDatapath({ pinRoot: root })).removedLegacy).toEqual([]);
  });

  it('meshcap uninstall removes them with the rest of an older datapath and frees the verdict', async () => {
    const root = testPinRoot();
    roots.push(root);
    await loadDatapath({ pinRoot: root });
    const verdict = await pinOldSplice(root); // as if the older version's load had left them
    const res = uninstallDatapath(root);
    expect(res.leftBehind).toEqual([]);
    for (const m of LEGACY_MAPS) expect(res.unpinned).toContain(path.join(pinLayout(root).maps, m));
    expect(existsSync(root)).toBe(false);
    await expect.poll(() => spliceProgs(verdict), { timeout: 10_000 }).toEqual([]);
  });
});
