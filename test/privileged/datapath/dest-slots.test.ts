// Destination slots (issue 19 item 2; docs/datapath.md "Destination slots"):
// a redirected IPv4 connection is sent to 127.S:15001, where S is the pod's
// slot for its original destination in mc_dstslot, so the proxy's
// SO_ORIGINAL_DST and the app's getpeername() are answered from the
// connection's own address, with nothing allocated or carried per
// connection. Each case checks the address the connection took, the answer
// the proxy got and the app's own view, on the slot path and on the
// fallback (127.0.0.1 and the sockets' storage) when no slot can be had.
import { execa } from 'execa';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { slotAddress, slotCandidates4 } from '../../../src/explain/kernel-verdict.js';
import { pinLayout } from '../../../src/loader/manifest.js';
import { MAP, mcSlot, mcSlotKey } from '../../../src/maps/layout.js';
import * as bpf from '../../../src/native/addon.js';
import { netnsCookie } from '../../../src/pod-netns.js';
import { describeEbpf, makeDriver, type Driver } from '../../helpers/datapaths.js';
import { appPython, Lab, scaled } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

const POD = '198.18.29.1';
const DSTS = ['198.18.29.2', '198.18.29.3', '198.18.29.4'];
const POD2 = '198.18.28.1';
const SRV2 = '198.18.28.2';
/** mc_dstslot's size here (the smallest --dstslot-entries) */
const SLOTS = 1_024;

const ip4 = (a: string) => Buffer.from(a.split('.').map(Number));

// One connection as a plain app (uid 1000) makes it: what it got back and its
// own view of the socket.
const CONNECT = `
import json, socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.sendall(b"x"); got = s.recv(64)
print(json.dumps({"peer": list(s.getpeername()), "sock": list(s.getsockname()), "got": got.decode()}))
`;

describeEbpf('eBPF mode: destination slots name each redirected IPv4 destination', () => {
  const lab = new Lab();
  let dp: Driver;
  let pod: { name: string; path: string };
  let proxy: Awaited<ReturnType<Lab['proxy']>>;
  let cookie: bigint;
  let slotFd: number;

  const connect = (ns: string, dst: string, port: number) =>
    appPython<{ peer: [string, number]; sock: [string, number]; got: string }>(ns, CONNECT, { args: [dst, String(port)], timeoutMs: 20_000 });
  /** The pod's slots, slot -> "addr:port>to". */
  const slots = (c = cookie) => new Map([...dp.ebpf!.slotsOf(c)].map(([s, v]) => {
    const d = mcSlot.decode(v);
    return [s, `${[...d.addr].join('.')}:${d.port}>${d.to}`];
  }));
  const putSlot = (c: bigint, slot: number, addr: string, port: number) =>
    bpf.mapUpdate(slotFd, mcSlotKey.encode({ netns: c, slot, pad: 0 }), mcSlot.encode({ addr: ip4(addr), port, to: 15001 }), 0);
  /** The proxy's accept for the connection just made (its newest). */
  const lastAccept = () => proxy.accepts().at(-1)!;

  beforeAll(async () => {
    // mc_dstslot sized down (--dstslot-entries): the size reaches the map, and filling it is quick
    dp = await makeDriver('ebpf', { mapSizes: { mc_dstslot: SLOTS } });
    pod = await lab.netns('slots');
    const srv = await lab.netns('slotsrv');
    await lab.link(pod.name, srv.name, { a4: [`${POD}/24`], b4: DSTS.map((d) => `${d}/24`) });
    await dp.register(pod.path, istioCapture({ ips: [POD], ipv6: false }), [POD]);
    cookie = await netnsCookie(pod.path);
    // Like Envoy: 0.0.0.0:15001; echo, so nothing leaves the pod
    proxy = await lab.proxy(pod.name, ['--echo']);
    slotFd = bpf.objGet(`${pinLayout(dp.ebpf!.pinRoot).maps}/${MAP.dstslot}`);
  }, scaled(120_000));

  afterAll(async () => {
    if (slotFd !== undefined) bpf.closeFd(slotFd);
    await dp?.close();
    await lab.cleanup();
  });

  it('one slot per destination and port for the pod\'s life: every connection to it goes to that address, and the proxy and the app see the destination', async () => {
    expect(slots().size).toBe(0);
    for (let round = 0; round < 3; round++) {
      for (const [i, d] of DSTS.entries()) {
        const port = 80 + (i % 2);
        const v = await connect(pod.name, d, port);
        expect(v.got).toBe('x');
        expect(v.peer, 'the app\'s getpeername, as under REDIRECT').toEqual([d, port]);
        expect(v.sock[0], 'the app\'s getsockname: the pod\'s address').toBe(POD);
        const a = lastAccept();
        expect(a.orig, 'SO_ORIGINAL_DST').toBe(`${d}:${port}`);
        expect(a.local).toBe(`${slotAddress(slotCandidates4(ip4(d), port)[0]!)}:15001`);
        expect(a.peer.split(':')[0], 'the proxy\'s peer: the pod\'s address').toBe(POD);
      }
    }
    const want = new Map(DSTS.map((d, i) => [slotCandidates4(ip4(d), 80 + (i % 2))[0]!, `${d}:${80 + (i % 2)}>15001`]));
    expect(slots()).toEqual(want);
  }, scaled(60_000));

  it('many first connects to a new destination at once: one slot, every connection on it with its destination', async () => {
    const d = DSTS[2]!;
    const port = 7070;
    const n = proxy.accepts().length;
    const all = await Promise.all(Array.from({ length: 8 }, () => connect(pod.name, d, port)));
    for (const v of all) expect(v.peer).toEqual([d, port]);
    const acc = proxy.accepts().slice(n);
    expect(acc.length).toBe(8);
    expect(new Set(acc.map((a) => a.local))).toEqual(new Set([`${slotAddress(slotCandidates4(ip4(d), port)[0]!)}:15001`]));
    for (const a of acc) expect(a.orig).toBe(`${d}:${port}`);
    expect([...slots().values()].filter((v) => v === `${d}:${port}>15001`).length).toBe(1);
  }, scaled(30_000));

  it('a candidate another destination holds: the next one', async () => {
    const d = DSTS[0]!;
    const port = 8080;
    const c = slotCandidates4(ip4(d), port);
    putSlot(cookie, c[0]!, '198.18.99.99', 1);
    const v = await connect(pod.name, d, port);
    expect(v.peer).toEqual([d, port]);
    expect(lastAccept().orig).toBe(`${d}:${port}`);
    expect(lastAccept().local).toBe(`${slotAddress(c[1]!)}:15001`);
    expect(slots().get(c[0]!)).toBe('198.18.99.99:1>15001');
    expect(slots().get(c[1]!)).toBe(`${d}:${port}>15001`);
  }, scaled(30_000));

  it('every candidate held by others: 127.0.0.1, with the original destination in the sockets\' storage, as before slots', async () => {
    const d = DSTS[1]!;
    const port = 8081;
    const c = slotCandidates4(ip4(d), port);
    for (const s of c) putSlot(cookie, s, '198.18.99.98', 2);
    const before = slots().size;
    for (let i = 0; i < 3; i++) {
      const v = await connect(pod.name, d, port);
      expect(v.peer, 'getpeername from the app socket\'s storage').toEqual([d, port]);
      expect(lastAccept().orig).toBe(`${d}:${port}`);
      expect(lastAccept().local).toBe('127.0.0.1:15001');
    }
    expect(slots().size).toBe(before);
  }, scaled(30_000));

  it('a full map: 127.0.0.1 and the storage; the agent\'s start sweeps slots of netns that are no pods', async () => {
    const max = bpf.mapInfo(slotFd).maxEntries;
    expect(max).toBe(SLOTS);
    const have = bpf.mapEntries(slotFd).count;
    // fill it with slots of a netns cookie no pod has
    const ghost = (1n << 62n) + 7n;
    const keys: Buffer[] = [];
    const values: Buffer[] = [];
    for (let i = 0; i < max - have; i++) {
      keys.push(mcSlotKey.encode({ netns: ghost, slot: 0x10000 + i, pad: 0 }));
      values.push(mcSlot.encode({ addr: ip4('198.18.99.97'), port: 3, to: 15001 }));
    }
    expect(bpf.mapUpdateEach(slotFd, keys, values)).toBe(keys.length);
    try {
      const d = DSTS[2]!;
      const v = await connect(pod.name, d, 9090);
      expect(v.peer).toEqual([d, 9090]);
      expect(lastAccept().orig).toBe(`${d}:9090`);
      expect(lastAccept().local).toBe('127.0.0.1:15001');
    } finally {
      // the start's sweep: every netns that is no pod loses its slots, the pod keeps its own
      const mine = slots().size;
      expect(await dp.ebpf!.sweepSlots({ all: true })).toBe(keys.length);
      expect(bpf.mapEntries(slotFd).count).toBe(mine);
    }
  }, scaled(60_000));

  it('a removed pod keeps its slots while its netns lives (a late SO_ORIGINAL_DST still answers); they go once the netns is gone', async () => {
    const pod2 = await lab.netns('slots2');
    const srv2 = await lab.netns('slotsrv2');
    await lab.link(pod2.name, srv2.name, { a4: [`${POD2}/24`], b4: [`${SRV2}/24`] });
    await dp.ebpf!.register({ netns: pod2.path, config: istioCapture({ ips: [POD2], ipv6: false }), podIPs: [POD2] });
    const cookie2 = await netnsCookie(pod2.path);
    const proxy2 = await lab.proxy(pod2.name, ['--echo']);
    expect((await connect(pod2.name, SRV2, 80)).peer).toEqual([SRV2, 80]);
    expect([...slots(cookie2).values()]).toEqual([`${SRV2}:80>15001`]);

    dp.ebpf!.remove(cookie2, pod2.path);
    expect(await dp.ebpf!.sweepSlots()).toBe(0);
    expect(slots(cookie2).size, 'kept while the netns lives').toBe(1);
    expect(slots().size, 'the other pod\'s are untouched').toBeGreaterThan(0);

    proxy2.proc.kill('SIGKILL');
    await new Promise((r) => proxy2.proc.once('exit', r));
    await execa('ip', ['netns', 'del', pod2.name]);
    expect(await dp.ebpf!.sweepSlots()).toBe(1);
    expect(slots(cookie2).size).toBe(0);
    expect(slots().size, 'the other pod\'s are untouched').toBeGreaterThan(0);
  }, scaled(60_000));
});
