// Connection capacity for IPv6 (issue 19 item 4). IPv6 has one loopback
// address, so eBPF mode sends a pod's redirected IPv6 connections to
// [::1]:15001 first (the app's TIME_WAIT ports stay reusable), and once half
// the pod's ephemeral range is open there, the next ones to a slot address of
// their destination in 100::/64 (routed to the pod's lo): a range per
// destination, as under iptables, on top of what ::1 holds.
//
// The pod's ip_local_port_range is narrowed to 64 ports, so the limit shows
// in a few hundred connections: iptables mode holds 64 per destination; eBPF
// mode at least as many (32 on ::1, then 64 per destination's slot).
import { execa } from 'execa';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { slotAddress6, slotCandidates6 } from '../../../src/explain/kernel-verdict.js';
import { pinLayout } from '../../../src/loader/manifest.js';
import { MAP, mcV6Spill, u64Key } from '../../../src/maps/layout.js';
import * as bpf from '../../../src/native/addon.js';
import { parseAddr } from '../../../src/redirect/cidr.js';
import { describeEbpf, describeModes, makeDriver, type Driver } from '../../helpers/datapaths.js';
import { appPython, Lab, scaled } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

const POD = '2001:db8:71::1';
const DSTS = ['2001:db8:71::2', '2001:db8:71::3', '2001:db8:71::4', '2001:db8:71::5'];
const PORTS = 64;
const v6bytes = (a: string) => parseAddr(a)!.bytes;

// Opens connections round the destinations and keeps them until each
// answered EADDRNOTAVAIL; prints what each got and the app's view of its last
// socket per destination. With "close", closes them all, then waits for the
// proxy side to close too (the app's sockets end in TIME_WAIT).
const HOLD = `
import errno, json, socket, sys
dsts = ${JSON.stringify(DSTS)}
held, got, done, view = [], {d: 0 for d in dsts}, set(), {}
while len(done) < len(dsts) and len(held) < 5000:
    for d in dsts:
        if d in done: continue
        s = socket.socket(socket.AF_INET6)
        s.settimeout(5)
        try:
            s.connect((d, 80))
        except OSError as e:
            s.close()
            if e.errno != errno.EADDRNOTAVAIL: raise
            done.add(d)
            continue
        held.append(s)
        got[d] += 1
        view[d] = {"peer": list(s.getpeername()[:2]), "sock": s.getsockname()[0]}
for s in held: s.close()
print(json.dumps({"got": got, "view": view}))
`;

const hold = (ns: string) => appPython<{ got: Record<string, number>; view: Record<string, { peer: [string, number]; sock: string }> }>(ns, HOLD);

describeModes('a pod\'s outbound IPv6 connections get a port range per destination, %s mode', (mode) => {
  const lab = new Lab();
  let dp: Driver;
  let pod: { name: string; path: string };
  let proxy: Awaited<ReturnType<Lab['proxy']>>;

  beforeAll(async () => {
    dp = await makeDriver(mode);
    pod = await lab.netns('v6spill');
    const srv = await lab.netns('v6spillsrv');
    await lab.link(pod.name, srv.name, { a6: [`${POD}/64`], b6: DSTS.map((d) => `${d}/64`) });
    await lab.exec(pod.name, ['sysctl', '-q', '-w', `net.ipv4.ip_local_port_range=41000 ${41000 + PORTS - 1}`]);
    await dp.register(pod.path, istioCapture({ ips: [POD] }), [POD]);
    // Like Envoy: [::]:15001 (and 0.0.0.0:15001); echo, so nothing leaves the pod
    proxy = await lab.proxy(pod.name, ['--echo']);
  }, scaled(120_000));

  afterAll(async () => {
    await dp?.close();
    await lab.cleanup();
  });

  it(`holds at least ${PORTS} connections per destination, each with its own original destination`, async () => {
    const before = proxy.accepts().length;
    const v = await hold(pod.name);
    let total = 0;
    for (const d of DSTS) {
      total += v.got[d]!;
      expect(v.got[d], `connections to ${d}`).toBeGreaterThanOrEqual(PORTS);
      // the app's view is REDIRECT's: its own address, the original peer
      expect(v.view[d]!.sock).toBe(POD);
      expect(v.view[d]!.peer).toEqual([d, 80]);
    }
    if (mode === 'iptables') expect(total).toBe(PORTS * DSTS.length);
    else expect(total).toBe(PORTS * DSTS.length + PORTS / 2); // ::1 first, up to half the range
    for (let i = 0; i < scaled(60) && proxy.accepts().length < before + total; i++) await new Promise((res) => setTimeout(res, 50));
    const acc = proxy.accepts().slice(before);
    expect(acc.length).toBe(total);
    for (const d of DSTS) expect(acc.filter((a) => a.orig === `[${d}]:80`).length, d).toBe(v.got[d]);
    if (mode === 'ebpf') {
      const onLoopback = acc.filter((a) => a.local === '[::1]:15001').length;
      const onSlots = acc.filter((a) => /^\[100::[0-9a-f:]+\]:15001$/.test(a.local)).length;
      expect(onLoopback).toBe(PORTS / 2);
      expect(onSlots).toBe(PORTS * DSTS.length);
      // every destination's slot connections on one address of its own
      const slotOf = new Map<string, Set<string>>();
      for (const a of acc.filter((x) => x.local.startsWith('[100::'))) slotOf.set(a.orig, (slotOf.get(a.orig) ?? new Set()).add(a.local));
      expect([...slotOf.values()].every((s) => s.size === 1)).toBe(true);
      expect(new Set([...slotOf.values()].map((s) => [...s][0])).size).toBe(DSTS.length);
      // the address meshcap explain computes (mc_slot_hash6's first probe: the slots were all free)
      for (const d of DSTS) expect([...slotOf.get(`[${d}]:80`)!][0], d).toBe(`[${slotAddress6(slotCandidates6(v6bytes(d), 80)[0]!)}]:15001`);
    }
  }, scaled(90_000));

  it('counts only what is open on ::1: back to 0 once the app closed them all', async () => {
    if (mode !== 'ebpf') return;
    const cookie = [...dp.ebpf!.pods()][0]!;
    let open = -1n;
    for (let i = 0; i < scaled(100) && open !== 0n; i++) {
      open = dp.ebpf!.v6Spill(cookie)!.open;
      if (open !== 0n) await new Promise((res) => setTimeout(res, 50));
    }
    expect(dp.ebpf!.v6Spill(cookie)).toEqual({ open: 0n, at: BigInt(PORTS / 2) });
    // the slots stay for the pod's life, one per destination
    expect(dp.ebpf!.slotsOf(cookie, 6).size).toBe(DSTS.length);
  });
});

// A neighbour that routes 100::/64 to the pod (inside this test's namespaces
// only) reaches a slot address there: with inbound capture the pod's
// sk_lookup program drops it; without, the proxy's SO_ORIGINAL_DST answers
// ENOENT for it (the pod's destination is neither told nor forwarded to, and
// the proxy is not sent to itself), so the proxy refuses it.
for (const inbound of [true, false]) {
  describeEbpf(`eBPF mode: a slot address reached from outside the pod answers nothing (inbound capture ${inbound ? 'on' : 'off'})`, () => {
    const lab = new Lab();
    let dp: Driver;
    let pod: { name: string; path: string };
    let srv: { name: string; path: string };
    let proxy: Awaited<ReturnType<Lab['proxy']>>;
    let slot: string;

    beforeAll(async () => {
      dp = await makeDriver('ebpf');
      pod = await lab.netns(inbound ? 'v6out' : 'v6outn');
      srv = await lab.netns(inbound ? 'v6outsrv' : 'v6outnsrv');
      await lab.link(pod.name, srv.name, { a6: [`${POD}/64`], b6: DSTS.map((d) => `${d}/64`) });
      await lab.exec(pod.name, ['sysctl', '-q', '-w', `net.ipv4.ip_local_port_range=41000 ${41000 + PORTS - 1}`]);
      const annotations: Record<string, string> = inbound ? {} : { 'traffic.sidecar.istio.io/includeInboundPorts': '' };
      await dp.register(pod.path, istioCapture({ ips: [POD], annotations }), [POD]);
      proxy = await lab.proxy(pod.name, ['--echo']);
      // past the threshold, so the pod has a slot for DSTS[0]
      const v = await hold(pod.name);
      const held = Object.values(v.got).reduce((x, y) => x + y, 0);
      for (let i = 0; i < scaled(100) && proxy.accepts().length < held; i++) await new Promise((res) => setTimeout(res, 50));
      slot = slotAddress6(slotCandidates6(v6bytes(DSTS[0]!), 80)[0]!);
      const cookie = [...dp.ebpf!.pods()][0]!;
      expect(dp.ebpf!.slotsOf(cookie, 6).has(slotCandidates6(v6bytes(DSTS[0]!), 80)[0]!)).toBe(true);
      await lab.exec(srv.name, ['ip', '-6', 'route', 'add', '100::/64', 'via', POD]);
    }, scaled(120_000));

    afterAll(async () => {
      await dp?.close();
      await lab.cleanup();
    });

    it('neither the proxy nor an app takes it as the pod\'s own connection', async () => {
      const before = proxy.accepts().length;
      const errorsBefore = proxy.lines.filter((l) => l.includes('"event":"error"')).length;
      const probe = `
import errno, json, socket
out = {}
for port in (15001, 9):
    s = socket.socket(socket.AF_INET6); s.settimeout(2)
    try:
        s.connect(("${slot}", port)); out[port] = "connected"
    except OSError as e:
        out[port] = errno.errorcode.get(e.errno, str(e.errno)) if e.errno else "timeout"
    s.close()
print(json.dumps(out))
`;
      const r = await execa('ip', ['netns', 'exec', srv.name, '/usr/bin/python3', '-c', probe], { timeout: scaled(30_000) });
      const out = JSON.parse(r.stdout) as Record<string, string>;
      expect(out['9']).not.toBe('connected');
      if (inbound) {
        expect(out['15001']).not.toBe('connected');
      } else {
        // the proxy's listener takes it, as it would on the pod's address, but gets no original destination
        for (let i = 0; i < scaled(40) && proxy.lines.filter((l) => l.includes('"event":"error"')).length === errorsBefore; i++) await new Promise((res) => setTimeout(res, 50));
        const errs = proxy.lines.filter((l) => l.includes('"event":"error"')).slice(errorsBefore);
        expect(errs.length, `${out['15001']}; the proxy said: ${proxy.lines.slice(-3).join(' | ')}`).toBe(1);
        expect(errs[0]).toMatch(/ENOENT|No such file/);
      }
      expect(proxy.accepts().length).toBe(before);
    });
  });
}

describeEbpf('eBPF mode: IPv6 below the threshold stays on ::1, and a pod removed takes its count with it', () => {
  const lab = new Lab();
  let dp: Driver;
  let pod: { name: string; path: string };

  beforeAll(async () => {
    dp = await makeDriver('ebpf');
    pod = await lab.netns('v6few');
    const srv = await lab.netns('v6fewsrv');
    await lab.link(pod.name, srv.name, { a6: [`${POD}/64`], b6: DSTS.map((d) => `${d}/64`) });
    await dp.register(pod.path, istioCapture({ ips: [POD] }), [POD]);
  }, scaled(120_000));

  afterAll(async () => {
    await dp?.close();
    await lab.cleanup();
  });

  it('writes the route and the threshold: half the default range', async () => {
    const r = await lab.exec(pod.name, ['ip', '-6', 'route', 'show', 'table', 'local', '100::/64']);
    expect(r.stdout).toMatch(/^local 100::\/64 dev lo/);
    const [lo, hi] = (await lab.exec(pod.name, ['sysctl', '-n', 'net.ipv4.ip_local_port_range'])).stdout.trim().split(/\s+/).map(Number);
    const cookie = [...dp.ebpf!.pods()][0]!;
    expect(dp.ebpf!.v6Spill(cookie)).toEqual({ open: 0n, at: BigInt(Math.floor((hi! - lo! + 1) / 2)) });
  });

  it('a few connections all go to ::1 and are counted while open', async () => {
    const proxy = await lab.proxy(pod.name, ['--echo']);
    const cookie = [...dp.ebpf!.pods()][0]!;
    const script = `
import socket, sys, json
ss = []
for d in ${JSON.stringify(DSTS)}:
    s = socket.socket(socket.AF_INET6); s.settimeout(5); s.connect((d, 80)); ss.append(s)
print(len(ss), flush=True)
sys.stdin.readline()
for s in ss: s.close()
`;
    const p = execa('ip', ['netns', 'exec', pod.name, 'setpriv', '--reuid=1000', '--regid=1000', '--clear-groups', '/usr/bin/python3', '-c', script], { stdin: 'pipe', timeout: scaled(30_000) });
    await new Promise<void>((res, rej) => {
      p.stdout!.once('data', () => res());
      p.catch(rej);
    });
    expect(dp.ebpf!.v6Spill(cookie)!.open).toBe(BigInt(DSTS.length));
    p.stdin!.end('\n');
    await p;
    for (let i = 0; i < scaled(100) && (dp.ebpf!.v6Spill(cookie)!.open !== 0n || proxy.accepts().length < DSTS.length); i++) await new Promise((res) => setTimeout(res, 50));
    expect(dp.ebpf!.v6Spill(cookie)!.open).toBe(0n);
    const acc = proxy.accepts();
    expect(acc.map((a) => a.local)).toEqual(DSTS.map(() => '[::1]:15001'));
    expect(acc.map((a) => a.orig).sort()).toEqual(DSTS.map((d) => `[${d}]:80`).sort());
    expect(dp.ebpf!.slotsOf(cookie, 6).size).toBe(0);
  });

  it('removing the pod removes its count', async () => {
    const cookie = [...dp.ebpf!.pods()][0]!;
    await dp.unregister(pod.path);
    expect(dp.ebpf!.v6Spill(cookie)).toBeNull();
  });

  it('the agent\'s start sweeps entries an earlier agent left for pods that are gone', async () => {
    // as an agent that did not know mc_v6spill leaves one when it removes a pod
    const fd = bpf.objGet(`${pinLayout(dp.ebpf!.pinRoot).maps}/${MAP.v6spill}`);
    try {
      bpf.mapUpdate(fd, u64Key(424242n), mcV6Spill.encode({ open: 3n, at: 14116n }), bpf.consts.BPF_ANY);
    } finally {
      bpf.closeFd(fd);
    }
    expect(dp.ebpf!.v6Spill(424242n)).toEqual({ open: 3n, at: 14116n });
    await dp.ebpf!.sweepSlots({ all: true });
    expect(dp.ebpf!.v6Spill(424242n)).toBeNull();
  });
});
