// Connection capacity (issue 19 item 4): a pod's redirected connections
// must get an ephemeral port range per original destination, as under
// iptables (where the app's socket keeps its destination), not one range
// shared by every connection to 127.0.0.1:15001. eBPF mode sends each
// destination to its own 127.0.0.0/8 address when the proxy listens on the
// wildcard address, and to 127.0.0.1 when it listens there only.
//
// The capacity case narrows the pod's ip_local_port_range to 64 ports (so
// the limit shows in a few hundred connections, not 28,232) and holds
// connections to two destinations until connect() says EADDRNOTAVAIL for
// both: 128 in both modes (before the spread, eBPF mode stopped at 64).
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { spreadLoopback4 } from '../../../src/explain/kernel-verdict.js';
import { loadDatapath, uninstallDatapath } from '../../../src/loader/datapath.js';
import { pinLayout } from '../../../src/loader/manifest.js';
import { MAP, mcListenKey } from '../../../src/maps/layout.js';
import * as bpf from '../../../src/native/addon.js';
import { EbpfBackend } from '../../../src/pod-datapath/ebpf.js';
import { describeEbpf, describeModes, makeDriver, type Driver } from '../../helpers/datapaths.js';
import { appPython, Lab, scaled, testPinRoot, type NsAgent } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

const POD = '198.18.27.1';
const DSTS = ['198.18.27.2', '198.18.27.3'];
const PORTS = 64;

/** The address connect4 picks (mc_spread_addr4), as meshcap explain computes it. */
const spread4 = (ip: string, port: number) => spreadLoopback4(Buffer.from(ip.split('.').map(Number)), port);

// Opens connections alternately to each destination and keeps them, until
// every destination answered EADDRNOTAVAIL; prints what each got and the
// app's view of one socket per destination.
const HOLD = `
import errno, json, socket, sys
dsts = ${JSON.stringify(DSTS)}
held, got, done, view = [], {d: 0 for d in dsts}, set(), {}
while len(done) < len(dsts) and len(held) < 5000:
    for d in dsts:
        if d in done: continue
        s = socket.socket()
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
        view.setdefault(d, {"peer": list(s.getpeername()), "sock": list(s.getsockname())})
print(json.dumps({"got": got, "view": view}))
`;

describeModes('a pod\'s outbound connections get a port range per destination, %s mode', (mode) => {
  const lab = new Lab();
  let dp: Driver;
  let pod: { name: string; path: string };
  let proxy: Awaited<ReturnType<Lab['proxy']>>;

  beforeAll(async () => {
    dp = await makeDriver(mode);
    pod = await lab.netns('spread');
    const srv = await lab.netns('spreadsrv');
    await lab.link(pod.name, srv.name, { a4: [`${POD}/24`], b4: DSTS.map((d) => `${d}/24`) });
    await lab.exec(pod.name, ['sysctl', '-q', '-w', `net.ipv4.ip_local_port_range=41000 ${41000 + PORTS - 1}`]);
    await dp.register(pod.path, istioCapture({ ips: [POD] }), [POD]);
    // Like Envoy: 0.0.0.0:15001 (and [::]:15001); echo, so nothing leaves the pod
    proxy = await lab.proxy(pod.name, ['--echo']);
  }, scaled(120_000));

  afterAll(async () => {
    await dp?.close();
    await lab.cleanup();
  });

  it(`holds ${PORTS} connections per destination, as many as the ports allow`, async () => {
    const before = proxy.accepts().length;
    const v = await appPython<{ got: Record<string, number>; view: Record<string, { peer: [string, number]; sock: [string, number] }> }>(pod.name, HOLD);
    for (const d of DSTS) {
      expect(v.got[d], `connections to ${d}`).toBe(PORTS);
      // the app's view is REDIRECT's: its own address, the original peer
      expect(v.view[d]!.sock[0]).toBe(POD);
      expect(v.view[d]!.peer).toEqual([d, 80]);
    }
    for (let i = 0; i < scaled(40) && proxy.accepts().length < before + PORTS * DSTS.length; i++) await new Promise((res) => setTimeout(res, 50));
    const acc = proxy.accepts().slice(before);
    expect(acc.length).toBe(PORTS * DSTS.length);
    // every one with its own original destination
    for (const d of DSTS) expect(acc.filter((a) => a.orig === `${d}:80`).length, d).toBe(PORTS);
    if (mode === 'ebpf') {
      // sent to the destination's own loopback address
      expect(new Set(DSTS.map((d) => spread4(d, 80))).size).toBe(DSTS.length);
      for (const a of acc) expect(a.local).toBe(`${spread4(a.orig.split(':')[0]!, 80)}:15001`);
    }
  }, scaled(90_000));
});

describeEbpf('eBPF mode: a proxy bound to 127.0.0.1 only keeps getting 127.0.0.1', () => {
  const lab = new Lab();
  let dp: Driver;
  let pod: { name: string; path: string };

  beforeAll(async () => {
    dp = await makeDriver('ebpf');
    pod = await lab.netns('spreadlo');
    const srv = await lab.netns('spreadlosrv');
    await lab.link(pod.name, srv.name, { a4: [`${POD}/24`], b4: DSTS.map((d) => `${d}/24`) });
    await dp.register(pod.path, istioCapture({ ips: [POD] }), [POD]);
  }, scaled(120_000));

  afterAll(async () => {
    await dp?.close();
    await lab.cleanup();
  });

  it('connects to 127.0.0.1:15001 and SO_ORIGINAL_DST is the destination', async () => {
    // linkerd2-proxy binds its outbound listener to 127.0.0.1 only
    const listener = lab.spawn(pod.name, ['/usr/bin/python3', '-u', '-c', `
import socket, struct
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 15001)); l.listen(16); print("ready", flush=True)
for _ in range(${DSTS.length}):
    c, peer = l.accept()
    o = c.getsockopt(socket.SOL_IP, 80, 16)
    port, addr = struct.unpack("!H", o[2:4])[0], socket.inet_ntoa(o[4:8])
    print("accept", c.getsockname()[0], peer[0], "%s:%d" % (addr, port), flush=True)
    # read the app's byte first: closing with unread data would answer with a reset
    c.recv(16); c.sendall(b"ok"); c.close()
`], { uid: 1337, until: /^ready/ });
    await listener.ready;
    const app = await lab.agent(pod.name, { uid: 1000 });
    for (const d of DSTS) expect((await app.connect(d, 80, 'x')).data).toBe('ok');
    for (let i = 0; i < scaled(40) && listener.lines.filter((l) => l.startsWith('accept')).length < DSTS.length; i++) await new Promise((res) => setTimeout(res, 50));
    const acc = listener.lines.filter((l) => l.startsWith('accept')).map((l) => l.split(' '));
    expect(acc.map((a) => a[3]).sort()).toEqual(DSTS.map((d) => `${d}:80`).sort());
    for (const a of acc) {
      expect(a[1], 'local address of the accepted socket').toBe('127.0.0.1');
      expect(a[2], 'the app\'s address').toBe(POD);
    }
  }, scaled(60_000));
});

// How connect4 knows a wildcard listener takes 127.x (docs/datapath.md,
// "Which loopback address"): sockops puts a listener on 0.0.0.0 at the
// outbound port into mc_listen (port 15001, family 4), the sockhash drops it
// when it stops listening, and without an entry the kernel's socket lookup
// decides as before. Each case checks which path it took (the entry there
// or not) and that every connection reached the proxy with its own original
// destination on the address that path must give: never refused, never at
// an address nothing listens on.
describeEbpf('eBPF mode: the spread follows the proxy\'s listener through restarts, rebinds and datapath reloads', () => {
  const lab = new Lab();
  const pinRoot = testPinRoot();
  let pods: EbpfBackend | null = null;
  let pod: { name: string; path: string };
  let cookie: bigint;
  let app: NsAgent;
  // Accepts until killed; one JSON line per connection.
  const LISTENER = (host: string, dev = '') => `
import json, socket, struct
fam = socket.AF_INET6 if ":" in "${host}" else socket.AF_INET
l = socket.socket(fam); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if fam == socket.AF_INET6: l.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
l.bind(("${host}", 15001)); l.listen(64)
if "${dev}": l.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"${dev}")
print("ready", flush=True)
while True:
    c, peer = l.accept()
    # as Envoy: SOL_IP for an IPv4 connection, v4-mapped on a dual-stack socket too
    if c.family == socket.AF_INET6 and not c.getsockname()[0].startswith("::ffff:"):
        o = c.getsockopt(41, 80, 28); port, addr = struct.unpack("!H", o[2:4])[0], socket.inet_ntop(socket.AF_INET6, o[8:24])
    else:
        o = c.getsockopt(socket.SOL_IP, 80, 16); port, addr = struct.unpack("!H", o[2:4])[0], socket.inet_ntoa(o[4:8])
    print(json.dumps({"local": c.getsockname()[0].replace("::ffff:", ""), "orig": "%s:%d" % (addr.replace("::ffff:", ""), port)}), flush=True)
    # read the app's byte first: closing with unread data would answer with a reset
    c.recv(16); c.sendall(b"ok"); c.close()
`;
  const start = async (host: string, dev = '') => {
    const s = lab.spawn(pod.name, ['/usr/bin/python3', '-u', '-c', LISTENER(host, dev)], { uid: 1337, until: /^ready/ });
    await s.ready;
    return s;
  };
  const stop = async (s: Awaited<ReturnType<typeof start>>) => {
    s.proc.kill('SIGKILL');
    await s.proc;
  };
  /** mc_listen's entry for the pod's outbound port (family 4), in any slot */
  const registered = () => {
    const fd = bpf.objGet(path.join(pinLayout(pinRoot).maps, MAP.listen));
    try {
      return bpf.mapKeys(fd, mcListenKey.size).map((k) => mcListenKey.decode(k)).some((k) => k.netns === cookie && k.port === 15001 && k.family === 4);
    } finally {
      bpf.closeFd(fd);
    }
  };
  /** One connection per destination through the listener; what it accepted. */
  const connectAll = async (s: Awaited<ReturnType<typeof start>>) => {
    const before = s.lines.filter((l) => l.startsWith('{')).length;
    for (const d of DSTS) {
      const r = await app.connect(d, 80, 'x').catch(async (e: Error) => {
        await new Promise((res) => setTimeout(res, 300));
        return { data: `${e.message}; the listener said: ${s.stderr().trim()}` };
      });
      expect(r.data, `connection to ${d}:80`).toBe('ok');
    }
    for (let i = 0; i < scaled(40) && s.lines.filter((l) => l.startsWith('{')).length < before + DSTS.length; i++) await new Promise((res) => setTimeout(res, 50));
    const acc = s.lines.filter((l) => l.startsWith('{')).slice(before).map((l) => JSON.parse(l) as { local: string; orig: string });
    expect(acc.map((a) => a.orig).sort()).toEqual(DSTS.map((d) => `${d}:80`).sort());
    return acc;
  };
  const expectSpread = (acc: { local: string; orig: string }[]) => {
    for (const a of acc) expect(a.local, a.orig).toBe(spread4(a.orig.split(':')[0]!, 80));
  };
  const expectLoopback1 = (acc: { local: string; orig: string }[]) => {
    for (const a of acc) expect(a.local, a.orig).toBe('127.0.0.1');
  };
  const register = async () => {
    pods = new EbpfBackend(pinRoot);
    cookie = await pods.register({ netns: pod.path, config: istioCapture({ ips: [POD] }), podIPs: [POD] });
  };

  beforeAll(async () => {
    pod = await lab.netns('spreadl');
    const srv = await lab.netns('spreadlsrv');
    await lab.link(pod.name, srv.name, { a4: [`${POD}/24`], b4: DSTS.map((d) => `${d}/24`) });
    await loadDatapath({ pinRoot });
    await register();
    app = await lab.agent(pod.name, { uid: 1000 });
  }, scaled(120_000));

  afterAll(async () => {
    pods?.close();
    uninstallDatapath(pinRoot);
    await lab.cleanup();
  });

  it('a wildcard listener is registered at listen() and gets the spread; 127.0.0.1 after it rebinds there, the spread again after it goes back', async () => {
    let s = await start('0.0.0.0');
    expect(registered()).toBe(true);
    expectSpread(await connectAll(s));
    // the proxy restarts bound to 127.0.0.1 only: its old entry is gone with its socket
    await stop(s);
    expect(registered()).toBe(false);
    s = await start('127.0.0.1');
    expect(registered()).toBe(false);
    expectLoopback1(await connectAll(s));
    await stop(s);
    s = await start('0.0.0.0');
    expect(registered()).toBe(true);
    expectSpread(await connectAll(s));
    await stop(s);
  }, scaled(60_000));

  it('a dual-stack [::] listener (not registered: sockops cannot read its v6only) gets the spread through the socket lookup', async () => {
    const s = await start('::');
    expect(registered()).toBe(false);
    expectSpread(await connectAll(s));
    await stop(s);
  }, scaled(60_000));

  it('a wildcard listener bound to a device after listen() (still registered) gets 127.0.0.1, as the socket lookup says', async () => {
    // bound to lo it still takes connections over lo, but the kernel's lookup
    // (no device) does not find it: connect4 checks the registered socket's
    // own fields and falls back to the lookup, as before the entry existed
    const s = await start('0.0.0.0', 'lo');
    expect(registered()).toBe(true);
    expectLoopback1(await connectAll(s));
    await stop(s);
  }, scaled(60_000));

  it('a listener that was already listening when the maps were recreated (uninstall, load) keeps getting the spread, then 127.0.0.1 once it rebinds', async () => {
    let s = await start('0.0.0.0');
    expect(registered()).toBe(true);
    // the programs alone replaced (maps kept): the entry stays
    await loadDatapath({ pinRoot });
    expect(registered()).toBe(true);
    expectSpread(await connectAll(s));
    // everything recreated under the running proxy, the pod registered again (what the agent does)
    pods?.close();
    uninstallDatapath(pinRoot);
    await loadDatapath({ pinRoot });
    await register();
    expect(registered(), 'sockops never saw this listen()').toBe(false);
    expectSpread(await connectAll(s));
    await stop(s);
    s = await start('127.0.0.1');
    expectLoopback1(await connectAll(s));
    await stop(s);
  }, scaled(90_000));
});
