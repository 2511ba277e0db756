// The shared inbound program (issue 19): each meshed pod's stub names its pod
// and tail-calls mc_inbound_main in slot 0 of mc_inbound_tail. Pods in
// different netns are captured at once, each to its own proxy with its own
// config; the shared program is replaced under traffic with no connection
// reaching an app around its proxy; an empty slot refuses captured traffic
// (loopback still passes); a pod whose whole mc_inbound was pinned before the
// upgrade keeps capturing beside the stubs; the per-CPU hand-off is exact
// under any interleaving (held hands, process-context test runs) and stubs of
// its earlier layout are moved onto a new one; uninstall leaves nothing.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { existsSync, readFileSync, rmSync, unlinkSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import * as bpf from '../../../src/native/addon.js';
import { effectiveMapSizes, loadDatapath, uninstallDatapath } from '../../../src/loader/datapath.js';
import { DEFAULT_MAP_SIZES } from '../../../src/loader/map-sizes.js';
import { INBOUND_ARG_SIZE, InboundSharedRefused, loadInboundShared, tailSlotProgId } from '../../../src/loader/inbound-shared.js';
import { INBOUND_SHARED_PROGRAM, INBOUND_STUB_PROGRAM, INBOUND_TAIL_MAP, pinLayout, POD_INBOUND_PROGRAM } from '../../../src/loader/manifest.js';
import { EbpfBackend } from '../../../src/pod-datapath/ebpf.js';
import { Lab, scaled, testPinRoot, type NsAgent } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';
import { describeEbpf } from '../../helpers/datapaths.js';

async function progShow(id: number): Promise<{ name: string; verified_insns?: number }> {
  const r = await execa('bpftool', ['prog', 'show', 'id', String(id), '-j']);
  return JSON.parse(r.stdout);
}

/** The program a pod's pinned link runs. */
function podProgId(pinRoot: string, cookie: bigint): number {
  const fd = bpf.objGet(pinLayout(pinRoot).podInbound(cookie));
  try {
    return bpf.linkInfo(fd).progId;
  } finally {
    bpf.closeFd(fd);
  }
}

function withPin<T>(pin: string, f: (fd: number) => T): T {
  const fd = bpf.objGet(pin);
  try {
    return f(fd);
  } finally {
    bpf.closeFd(fd);
  }
}

/** The proxy logs each accept on its stdout, read here a little after the client has its reply. */
async function settled(done: () => boolean, ms = 3000): Promise<void> {
  const end = Date.now() + ms;
  while (!done() && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
}

/** A per-CPU map's value comes back once per possible CPU. */
const NCPU = Number(/^0-(\d+)$/.exec(readFileSync('/sys/devices/system/cpu/possible', 'utf8').trim())?.[1] ?? 0) + 1;

/** Connections the stubs refused with slot 0 empty (mc_inbound_arg.tail_failed, after the 4 hands, over every CPU). */
function tailFailed(pinRoot: string): bigint {
  return withPin(path.join(pinLayout(pinRoot).maps, 'mc_inbound_arg'), (fd) => {
    const v = bpf.mapLookup(fd, Buffer.alloc(4), INBOUND_ARG_SIZE * NCPU)!;
    let n = 0n;
    for (let c = 0; c < NCPU; c++) n += v.readBigUInt64LE(c * INBOUND_ARG_SIZE + INBOUND_ARG_SIZE - 8);
    return n;
  });
}

describeEbpf('shared inbound program and per-pod stubs', () => {
  const lab = new Lab();
  const pinRoot = testPinRoot();
  const L = pinLayout(pinRoot);
  let be: EbpfBackend;
  let client: NsAgent;
  const pods: { name: string; path: string; ip: string; app: NsAgent; cookie?: bigint; proxy?: Awaited<ReturnType<Lab['proxy']>> }[] = [];
  // pod 1 excludes 8080: a stub that ran with another pod's cookie would show
  const cfg = (i: number) => istioCapture({ ips: [pods[i]!.ip], ipv6: false, ...(i === 1 ? { annotations: { 'traffic.sidecar.istio.io/excludeInboundPorts': '8080' } } : {}) });
  const inbound = (i: number) => pods[i]!.proxy!.accepts().filter((a) => a.listener === 'inbound').map((a) => a.orig);
  const register = async (i: number) => {
    const p = pods[i]!;
    p.cookie = await be.register({ netns: p.path, config: cfg(i), podIPs: [p.ip] });
    p.proxy ??= await lab.proxy(p.name);
    return p.cookie;
  };

  beforeAll(async () => {
    const cl = await lab.netns('shcli');
    for (let i = 0; i < 3; i++) {
      const p = await lab.netns(`shpod${i}`);
      const ip = `198.18.${60 + i}.1`;
      await lab.link(p.name, cl.name, { a4: [`${ip}/24`], b4: [`198.18.${60 + i}.2/24`] });
      const app = await lab.agent(p.name);
      for (const port of [8080, 8081]) await app.listen('0.0.0.0', port);
      pods.push({ ...p, ip, app });
    }
    client = await lab.agent(cl.name);
  }, scaled(120_000));

  afterAll(async () => {
    await lab.cleanup();
    be?.close();
    if (existsSync(pinRoot)) uninstallDatapath(pinRoot);
  });

  it('a pod whose whole mc_inbound was pinned before the upgrade keeps capturing once the shared program is loaded', async () => {
    // A pin root as meshcap before issue 19 left it: no prog array, no shared program.
    await loadDatapath({ pinRoot });
    for (const p of [L.prog(INBOUND_SHARED_PROGRAM), path.join(L.maps, INBOUND_TAIL_MAP), path.join(L.maps, 'mc_inbound_arg')]) unlinkSync(p);
    rmSync(L.progs, { recursive: true });
    be = new EbpfBackend(pinRoot);
    const cookie = await register(2);
    const wholeId = podProgId(pinRoot, cookie);
    expect((await progShow(wholeId)).name).toBe(POD_INBOUND_PROGRAM);
    expect((await client.connect(pods[2]!.ip, 8080, 'before')).data).toBe(`${pods[2]!.ip}:8080|before`);
    expect(inbound(2)).toEqual([`${pods[2]!.ip}:8080`]);
    be.close();

    const up = await loadDatapath({ pinRoot });
    expect(up.inbound, `this kernel refused the shared inbound program: ${JSON.stringify(up.unavailable)}`).not.toBeNull();
    expect(up.inbound?.action).toBe('created');
    be = new EbpfBackend(pinRoot);
    // adopted as it is: same link, same whole program, still capturing
    expect(await be.register({ netns: pods[2]!.path, config: cfg(2), podIPs: [pods[2]!.ip] })).toBe(cookie);
    expect(podProgId(pinRoot, cookie)).toBe(wholeId);
    expect((await client.connect(pods[2]!.ip, 8080, 'after')).data).toBe(`${pods[2]!.ip}:8080|after`);
    expect(inbound(2)).toHaveLength(2);
    // a reload adopts the shared program it finds in the slot
    expect((await loadDatapath({ pinRoot })).inbound?.action).toBe('adopted');
  }, scaled(60_000));

  it('captures pods in different netns at once through their stubs, each to its own proxy with its own config', async () => {
    for (const i of [0, 1]) {
      const cookie = await register(i);
      const shown = await progShow(podProgId(pinRoot, cookie));
      expect(shown.name).toBe(INBOUND_STUB_PROGRAM);
      // 254 on 6.18 (the 4 hands; 81 before), against ~1,000 for a whole program
      if (shown.verified_insns !== undefined) expect(shown.verified_insns).toBeLessThan(400);
    }
    // interleaved from parallel lanes (both CPUs' arg slots in use), every pod and port
    const jobs: Promise<{ data: string }>[] = [];
    for (let k = 0; k < 60; k++) for (const i of [0, 1, 2]) jobs.push(client.connect(pods[i]!.ip, 8080 + (k % 2), `k${k}`));
    const res = await Promise.all(jobs);
    await settled(() => inbound(0).length === 60 && inbound(1).length === 30 && inbound(2).length === 62);
    res.forEach((r, j) => expect(r.data).toBe(`${pods[j % 3]!.ip}:${8080 + (Math.floor(j / 3) % 2)}|k${Math.floor(j / 3)}`));
    expect(inbound(0).filter((o) => o === `${pods[0]!.ip}:8080`)).toHaveLength(30);
    expect(inbound(0).filter((o) => o === `${pods[0]!.ip}:8081`)).toHaveLength(30);
    // pod 1 excludes 8080: only 8081 reached its proxy
    expect(inbound(1)).toEqual(Array(30).fill(`${pods[1]!.ip}:8081`));
    expect(inbound(2).slice(2)).toHaveLength(60);
    expect(inbound(2).every((o) => o.startsWith(`${pods[2]!.ip}:`))).toBe(true);
    expect(be.stats(pods[0]!.cookie!)!.inbound).toBe(60n);
    expect(be.stats(pods[1]!.cookie!)!.inbound).toBe(30n);
  }, scaled(60_000));

  it('the hand-off is exact whatever runs between a stub and the shared program: a hand another lookup holds is never read, a process-context lookup gets its own pod\'s decision, SYNs are captured beside held hands', async () => {
    const argPin = path.join(L.maps, 'mc_inbound_arg');
    const KEY = Buffer.alloc(4);
    const FOREIGN = 0xffff888000001000n; // an owner no lookup of this test has: a ctx pointer of a lookup interrupted or preempted after its stub's write
    const v4 = (a: string) => Buffer.from(a.split('.').map(Number));
    const ctxFor = (i: number, port: number): bpf.SkLookupTestCtx => ({ family: 2, remoteIp: v4('198.18.9.9'), remotePort: 40000, localIp: v4(pods[i]!.ip), localPort: port });
    // every CPU's first n hands held with pod 0's cookie (pod 0 captures 8080; pod 1 excludes it)
    const hold = (n: number) =>
      withPin(argPin, (fd) => {
        const v = Buffer.alloc(INBOUND_ARG_SIZE * NCPU);
        for (let c = 0; c < NCPU; c++) {
          for (let h = 0; h < n; h++) {
            v.writeBigUInt64LE(FOREIGN + BigInt(h * 64), c * INBOUND_ARG_SIZE + h * 16);
            v.writeBigUInt64LE(pods[0]!.cookie!, c * INBOUND_ARG_SIZE + h * 16 + 8);
          }
        }
        bpf.mapUpdate(fd, KEY, v);
      });
    const owners = () =>
      withPin(argPin, (fd) => {
        const v = bpf.mapLookup(fd, KEY, INBOUND_ARG_SIZE * NCPU)!;
        return Array.from({ length: NCPU }, (_, c) => [0, 1, 2, 3].map((h) => v.readBigUInt64LE(c * INBOUND_ARG_SIZE + h * 16)));
      });
    // BPF_PROG_TEST_RUN runs the program in this thread's process context with
    // bottom halves enabled (bpf_test_timer: preempt_disable only), as an
    // nftables socket match or a cgroup program's bpf_sk_lookup_tcp would
    const run = (progFd: number, i: number, port: number) => bpf.progTestRunSkLookup(progFd, ctxFor(i, port));
    const stub = (i: number) => bpf.progGetFdById(podProgId(pinRoot, pods[i]!.cookie!));
    const shared = bpf.objGet(L.prog(INBOUND_SHARED_PROGRAM));
    const stubs = [stub(0), stub(1)];
    try {
      hold(1);
      // the shared program reached without a hand of its own (what the
      // interrupted lookup's read was before 2026-11-25: the slot's cookie,
      // pod 0's, whoever wrote it) decides nothing: pod 0 would capture 8080
      expect(run(shared, 0, 8080)).toEqual({ retval: 1, cookie: 0n });
      // each stub claims a free hand: its own pod's rules, though hand 0 holds pod 0's cookie
      expect(run(stubs[1]!, 1, 8080), 'pod 1 excludes 8080: pod 0\'s decision would capture it').toEqual({ retval: 1, cookie: 0n });
      const p1 = run(stubs[1]!, 1, 8081);
      const p0 = run(stubs[0]!, 0, 8081);
      expect(p1.retval).toBe(1);
      expect(p1.cookie, 'pod 1 captures 8081: assigned to its proxy').not.toBe(0n);
      expect(p0.cookie).not.toBe(0n);
      expect(p1.cookie, 'pod 1 and pod 0 assigned to the same listener').not.toBe(p0.cookie);
      // nobody took the held hand; every hand a run claimed was freed
      for (const o of owners()) expect(o).toEqual([FOREIGN, 0n, 0n, 0n]);
      // real SYNs (softirq) beside the held hand: each to its own pod's proxy
      const n0 = inbound(0).length;
      const n1 = inbound(1).length;
      expect((await client.connect(pods[0]!.ip, 8080, 'held')).data).toBe(`${pods[0]!.ip}:8080|held`);
      expect((await client.connect(pods[1]!.ip, 8080, 'held')).data).toBe(`${pods[1]!.ip}:8080|held`);
      expect((await client.connect(pods[1]!.ip, 8081, 'held')).data).toBe(`${pods[1]!.ip}:8081|held`);
      await settled(() => inbound(0).length > n0 && inbound(1).length > n1);
      expect(inbound(0).slice(n0)).toEqual([`${pods[0]!.ip}:8080`]);
      expect(inbound(1).slice(n1), 'pod 1\'s 8080 went to its proxy: pod 0\'s cookie was used').toEqual([`${pods[1]!.ip}:8081`]);
      for (const o of owners()) expect(o).toEqual([FOREIGN, 0n, 0n, 0n]);
      // every hand held (never seen: 4 lookups in flight on one CPU): refused, never around the proxy; loopback passes
      hold(4);
      const failed0 = tailFailed(pinRoot);
      await expect(client.connect(pods[0]!.ip, 8080, 'full')).rejects.toThrow(/ECONNREFUSED|refused/i);
      const failed1 = tailFailed(pinRoot);
      expect(failed1 - failed0).toBeGreaterThanOrEqual(1n);
      // the pod's loopback is passed by the stub itself, before it claims a hand
      expect((await pods[0]!.app.connect('127.0.0.1', 8081, 'lo')).data).toBe('127.0.0.1:8081|lo');
      expect(tailFailed(pinRoot), 'a loopback connection went through the stub\'s hands').toBe(failed1);
      expect(inbound(0).slice(n0)).toHaveLength(1);
    } finally {
      hold(0);
      for (const fd of [shared, ...stubs]) bpf.closeFd(fd);
    }
    expect((await client.connect(pods[0]!.ip, 8080, 'free')).data).toBe(`${pods[0]!.ip}:8080|free`);
  }, scaled(60_000));

  it('replaces the shared program under traffic: every connection reaches the proxy', async () => {
    const tailPin = path.join(L.maps, INBOUND_TAIL_MAP);
    const before = withPin(tailPin, tailSlotProgId);
    const n0 = inbound(0).length;
    let stop = false;
    let sent = 0;
    const lanes = Array.from({ length: 4 }, async () => {
      for (let k = 0; !stop && k < 500; k++) {
        const r = await client.connect(pods[0]!.ip, 8080, 'live');
        expect(r.data).toBe(`${pods[0]!.ip}:8080|live`);
        sent++;
      }
    });
    const replaced: { action: string; progId: number }[] = [];
    try {
      const sizes = effectiveMapSizes(L.maps, DEFAULT_MAP_SIZES);
      for (let r = 0; r < 5; r++) {
        // traffic between every two replacements, however slow the machine
        // (a fixed 40 ms gave 13-19 connections in loaded TCG guests)
        const want = sent + 5;
        const deadline = Date.now() + scaled(10_000);
        while (sent < want && Date.now() < deadline) await new Promise((res) => setTimeout(res, 5));
        unlinkSync(L.prog(INBOUND_SHARED_PROGRAM)); // this load then takes the slot as from another build
        replaced.push(await loadInboundShared(pinRoot, sizes));
      }
    } finally {
      stop = true;
      await Promise.all(lanes);
    }
    expect(replaced.map((r) => r.action)).toEqual(Array(5).fill('replaced'));
    expect(sent).toBeGreaterThan(20);
    expect(new Set([before, ...replaced.map((r) => r.progId)]).size).toBe(6);
    expect(withPin(tailPin, tailSlotProgId)).toBe(replaced.at(-1)!.progId);
    await settled(() => inbound(0).length - n0 === sent);
    expect(inbound(0).length - n0, 'connections that reached the app around the proxy').toBe(sent);
  }, scaled(120_000));

  it('with slot 0 empty a stub refuses captured connections (never around the proxy) and lets the pod\'s loopback pass', async () => {
    const tailPin = path.join(L.maps, INBOUND_TAIL_MAP);
    const failed0 = tailFailed(pinRoot);
    withPin(tailPin, (fd) => bpf.mapDelete(fd, Buffer.alloc(4)));
    try {
      const n = inbound(0).length;
      await expect(client.connect(pods[0]!.ip, 8080, 'empty')).rejects.toThrow(/ECONNREFUSED|refused/i);
      expect(inbound(0)).toHaveLength(n);
      const failed1 = tailFailed(pinRoot);
      expect(failed1 - failed0).toBeGreaterThanOrEqual(1n);
      // the pod's own loopback traffic (app to proxy, proxy to app) is never
      // captured: the stub passes it without the tail call
      expect((await pods[0]!.app.connect('127.0.0.1', 8081, 'lo')).data).toBe('127.0.0.1:8081|lo');
      expect(tailFailed(pinRoot), 'a loopback connection went through the tail call').toBe(failed1);
      // the whole program of the pod pinned before the upgrade does not depend on the slot
      expect((await client.connect(pods[2]!.ip, 8080, 'whole')).data).toBe(`${pods[2]!.ip}:8080|whole`);
    } finally {
      const back = await loadDatapath({ pinRoot });
      expect(back.inbound?.action).toBe('created');
    }
    expect((await client.connect(pods[0]!.ip, 8080, 'back')).data).toBe(`${pods[0]!.ip}:8080|back`);
    expect(inbound(0).at(-1)).toBe(`${pods[0]!.ip}:8080`);
  }, scaled(60_000));

  it('the prog array\'s pin removed by hand: its stubs refuse, and the next load moves every stub onto the new array in place', async () => {
    unlinkSync(path.join(L.maps, INBOUND_TAIL_MAP));
    // the kernel empties a prog array (deferred work) once no pin or fd holds it
    let refused = false;
    for (let k = 0; k < 50 && !refused; k++) {
      refused = await client.connect(pods[0]!.ip, 8080, 'orphan').then(() => false, () => true);
      if (!refused) await new Promise((r) => setTimeout(r, 50));
    }
    expect(refused, 'a stub on the emptied array still let a captured connection through').toBe(true);
    const links = [0, 1, 2].map((i) => withPin(L.podInbound(pods[i]!.cookie!), (fd) => bpf.linkInfo(fd)));
    const back = await loadDatapath({ pinRoot });
    expect(back.inbound?.action).toBe('created');
    expect(back.inbound?.relinked, 'the two stubs (not the whole program of pod 2)').toBe(2);
    const after = [0, 1, 2].map((i) => withPin(L.podInbound(pods[i]!.cookie!), (fd) => bpf.linkInfo(fd)));
    expect(after.map((l) => l.id)).toEqual(links.map((l) => l.id)); // same links, updated in place
    expect(after[0]!.progId).not.toBe(links[0]!.progId);
    expect(after[2]!.progId).toBe(links[2]!.progId);
    const n = inbound(0).length;
    expect((await client.connect(pods[0]!.ip, 8080, 'moved')).data).toBe(`${pods[0]!.ip}:8080|moved`);
    expect((await client.connect(pods[1]!.ip, 8081, 'moved')).data).toBe(`${pods[1]!.ip}:8081|moved`);
    expect((await client.connect(pods[2]!.ip, 8080, 'moved')).data).toBe(`${pods[2]!.ip}:8080|moved`);
    await settled(() => inbound(0).length > n && inbound(1).at(-1) !== undefined);
    expect(inbound(0).at(-1)).toBe(`${pods[0]!.ip}:8080`);
    expect(inbound(1).at(-1)).toBe(`${pods[1]!.ip}:8081`);
    await settled(() => inbound(2).at(-1) === `${pods[2]!.ip}:8080` && inbound(2).length > 62);
    expect(inbound(2).length).toBeGreaterThan(62);
  }, scaled(60_000));

  it('a hand-off of the layout before 2026-11-25 pinned (16 bytes, one cookie per CPU): the load makes a new array and arg and moves every stub onto them', async () => {
    // as the build before left it: its stubs tail-call a program that reads one unguarded cookie per CPU
    const argPin = path.join(L.maps, 'mc_inbound_arg');
    unlinkSync(argPin);
    await execa('bpftool', ['map', 'create', argPin, 'type', 'percpu_array', 'key', '4', 'value', '16', 'entries', '1', 'name', 'mc_inbound_arg']);
    const tailBefore = withPin(path.join(L.maps, INBOUND_TAIL_MAP), (fd) => bpf.mapInfo(fd).id);
    const links = [0, 1, 2].map((i) => withPin(L.podInbound(pods[i]!.cookie!), (fd) => bpf.linkInfo(fd)));
    const up = await loadDatapath({ pinRoot });
    expect(up.inbound?.action).toBe('created');
    expect(up.inbound?.relinked, 'the two stubs (not the whole program of pod 2)').toBe(2);
    expect(withPin(argPin, (fd) => bpf.mapInfo(fd).valueSize)).toBe(INBOUND_ARG_SIZE);
    expect(withPin(path.join(L.maps, INBOUND_TAIL_MAP), (fd) => bpf.mapInfo(fd).id)).not.toBe(tailBefore);
    const after = [0, 1, 2].map((i) => withPin(L.podInbound(pods[i]!.cookie!), (fd) => bpf.linkInfo(fd)));
    expect(after.map((l) => l.id)).toEqual(links.map((l) => l.id));
    expect(after[0]!.progId).not.toBe(links[0]!.progId);
    expect(after[2]!.progId).toBe(links[2]!.progId);
    const n0 = inbound(0).length;
    const n1 = inbound(1).length;
    expect((await client.connect(pods[0]!.ip, 8080, 'relaid')).data).toBe(`${pods[0]!.ip}:8080|relaid`);
    expect((await client.connect(pods[1]!.ip, 8081, 'relaid')).data).toBe(`${pods[1]!.ip}:8081|relaid`);
    await settled(() => inbound(0).length > n0 && inbound(1).length > n1);
    expect(inbound(0).slice(n0)).toEqual([`${pods[0]!.ip}:8080`]);
    expect(inbound(1).slice(n1)).toEqual([`${pods[1]!.ip}:8081`]);
  }, scaled(60_000));

  it('a load whose shared program is refused moves the stubs linked before onto whole programs: nothing runs the old one\'s hand-off', async () => {
    const sizes = effectiveMapSizes(L.maps, DEFAULT_MAP_SIZES);
    const err = await loadInboundShared(pinRoot, sizes, path.join(pinRoot, 'no-objects-here')).then(() => null, (e: unknown) => e);
    expect(err).toBeInstanceOf(InboundSharedRefused);
    expect((err as InboundSharedRefused).retired).toBe(2);
    expect(existsSync(L.prog(INBOUND_SHARED_PROGRAM)), 'new pods would still get stubs').toBe(false);
    for (const i of [0, 1]) expect((await progShow(podProgId(pinRoot, pods[i]!.cookie!))).name).toBe(POD_INBOUND_PROGRAM);
    const n1 = inbound(1).length;
    expect((await client.connect(pods[1]!.ip, 8080, 'whole')).data).toBe(`${pods[1]!.ip}:8080|whole`);
    expect((await client.connect(pods[1]!.ip, 8081, 'whole')).data).toBe(`${pods[1]!.ip}:8081|whole`);
    await settled(() => inbound(1).length > n1);
    expect(inbound(1).slice(n1)).toEqual([`${pods[1]!.ip}:8081`]);
    expect((await loadDatapath({ pinRoot })).inbound?.action).toBe('replaced');
  }, scaled(60_000));

  it('uninstall removes the prog array, the shared program and every stub', async () => {
    const sharedId = withPin(L.prog(INBOUND_SHARED_PROGRAM), (fd) => bpf.progInfo(fd).id);
    be.close();
    const res = uninstallDatapath(pinRoot);
    expect(res.leftBehind).toEqual([]);
    expect(res.unpinned).toEqual(expect.arrayContaining([L.prog(INBOUND_SHARED_PROGRAM), path.join(L.maps, INBOUND_TAIL_MAP), path.join(L.maps, 'mc_inbound_arg')]));
    expect(existsSync(pinRoot)).toBe(false);
    const end = Date.now() + 5000;
    while (Date.now() < end && (await execa('bpftool', ['prog', 'show', 'id', String(sharedId)], { reject: false })).exitCode === 0) await new Promise((r) => setTimeout(r, 50));
    expect((await execa('bpftool', ['prog', 'show', 'id', String(sharedId)], { reject: false })).exitCode, 'the shared program outlived uninstall').not.toBe(0);
    expect((await client.connect(pods[0]!.ip, 8080, 'gone')).data).toBe(`${pods[0]!.ip}:8080|gone`);
  }, scaled(60_000));
});
