// Outbound capture on this kernel, in eBPF mode (real programs attached at the
// cgroup v2 root) and in iptables mode (Istio's rules in each pod netns): real
// pods (network namespaces), real connections to servers that exist only
// inside the test's namespaces, unmodified proxies reading SO_ORIGINAL_DST.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { execa } from 'execa';
import { chmodSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { netnsCookie } from '../../../src/pod-netns.js';
import * as bpf from '../../../src/native/addon.js';
import { mcOrig, mcPod, PodFlag, type McPod } from '../../../src/maps/layout.js';
import { Lab, scaled, type NsAgent } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';
import { describeModes, makeDriver, type Driver } from '../../helpers/datapaths.js';

describeModes('outbound capture, %s mode', (mode) => {
const lab = new Lab();
let dp: Driver;
let pod1: { name: string; path: string }, pod2: typeof pod1, pod3: typeof pod1, plain: typeof pod1;
let app1: NsAgent, app2: NsAgent, app3: NsAgent, appPlain: NsAgent, proxyUidApp1: NsAgent;
let proxy1: Awaited<ReturnType<Lab['proxy']>>, proxy2: Awaited<ReturnType<Lab['proxy']>>;
const POD_IPS = ['198.18.1.1', '2001:db8:1::1'];
let tmp: string;

beforeAll(async () => {
  tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-outbound-'));
  chmodSync(tmp, 0o755); // haproxy runs as the proxy uid
  dp = await makeDriver(mode);

  pod1 = await lab.netns('pod1');
  pod2 = await lab.netns('pod2');
  pod3 = await lab.netns('pod3');
  plain = await lab.netns('plain');
  const srv = await lab.netns('srv');
  const srv2 = await lab.netns('srv2');
  const srv3 = await lab.netns('srv3');
  const srvAddrs = { b4: ['198.18.1.2/24', '198.18.1.3/24', '198.18.1.4/24', '198.18.1.53/24'], b6: ['2001:db8:1::2/64', '2001:db8:1::3/64'] };
  await lab.link(pod1.name, srv.name, { a4: ['198.18.1.1/24'], a6: ['2001:db8:1::1/64'], ...srvAddrs });
  await lab.link(pod2.name, srv2.name, { a4: ['198.18.1.1/24'], a6: ['2001:db8:1::1/64'], ...srvAddrs });
  await lab.link(pod3.name, srv3.name, { a4: ['198.18.1.1/24'], ...srvAddrs });
  await lab.link(plain.name, srv.name, { a4: ['198.18.2.1/24'], b4: ['198.18.2.2/24'] });

  for (const [ns, tag] of [[srv.name, 'srv'], [srv2.name, 'srv2'], [srv3.name, 'srv3']] as const) {
    const s = await lab.agent(ns);
    for (const h of ['198.18.1.2', '198.18.1.3', '198.18.1.4', '2001:db8:1::2', '2001:db8:1::3']) {
      await s.listen(h, 80);
      await s.listen(h, 5555);
    }
    if (tag === 'srv') await s.listen('198.18.1.2', 7, 'echo');
    if (tag === 'srv') await s.listen('198.18.2.2', 80);
  }

  app1 = await lab.agent(pod1.name);
  app2 = await lab.agent(pod2.name);
  app3 = await lab.agent(pod3.name);
  appPlain = await lab.agent(plain.name);
  proxyUidApp1 = await lab.agent(pod1.name, { uid: 1337 });
  await app1.listen('198.18.1.1', 8080); // the app's own port, for the own-pod case
  proxy1 = await lab.proxy(pod1.name);
  proxy2 = await lab.proxy(pod2.name);
  await dp.register(pod1.path, istioCapture({ ips: POD_IPS, annotations: { 'traffic.sidecar.istio.io/excludeOutboundPorts': '5555' } }), POD_IPS);
  await dp.register(pod2.path, istioCapture({ ips: POD_IPS }), POD_IPS);
}, scaled(120_000));

afterAll(async () => {
  await lab.cleanup();
  await dp?.close();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

  it('sends an app connection through the reference proxy to the original destination (IPv4)', async () => {
    const n = proxy1.accepts().length;
    const r = await app1.connect('198.18.1.2', 80, 'hello-v4');
    expect(r.data, proxy1.lines.join('\n') + proxy1.stderr()).toBe('198.18.1.2:80|hello-v4');
    expect(proxy1.accepts().slice(n).map((a) => a.orig)).toEqual(['198.18.1.2:80']);
    if (dp.ebpf) expect(dp.ebpf.stats(await netnsCookie(pod1.path))!.outbound).toBeGreaterThan(0n);
  });

  it('answers SO_ORIGINAL_DST with the struct an iptables REDIRECT gives', async () => {
    const n = proxy1.accepts().length;
    await app1.connect('198.18.1.3', 80, 'raw');
    const a = proxy1.accepts().slice(n).find((x) => x.orig === '198.18.1.3:80')!;
    // struct sockaddr_in: AF_INET, port 80 big-endian, 198.18.1.3, 8 zero bytes;
    // optlen stays the caller's 128 (sockaddr_storage), the rest zero, as REDIRECT gives
    expect(a.optlen).toBe(128);
    expect(a.raw).toBe(('0200' + '0050' + 'c6120103' + '0000000000000000').padEnd(256, '0'));
    const m = proxy1.accepts().length;
    await app1.connect('2001:db8:1::3', 80, 'raw6');
    const b = proxy1.accepts().slice(m).find((x) => x.orig === '[2001:db8:1::3]:80')!;
    // struct sockaddr_in6: AF_INET6 (10), port, flowinfo 0, address, scope 0
    expect(b.optlen).toBe(128);
    expect(b.raw).toBe(('0a00' + '0050' + '00000000' + '20010db8000100000000000000000003' + '00000000').padEnd(256, '0'));
  });

  it('captures IPv6 and IPv4-mapped IPv6 connects', async () => {
    const v6 = proxy1.accepts().length;
    expect((await app1.connect('2001:db8:1::2', 80, 'v6')).data).toBe('[2001:db8:1::2]:80|v6');
    expect(proxy1.accepts().slice(v6).map((a) => a.orig)).toEqual(['[2001:db8:1::2]:80']);
    const n = proxy1.accepts().length;
    expect((await app1.connect('::ffff:198.18.1.2', 80, 'mapped')).data).toBe('198.18.1.2:80|mapped');
    expect(proxy1.accepts().slice(n).map((a) => a.orig)).toEqual(['198.18.1.2:80']);
  });

  it('leaves excluded ports, loopback and the proxy uid alone', async () => {
    const n = proxy1.accepts().length;
    expect((await app1.connect('198.18.1.2', 5555, 'excluded')).data).toBe('198.18.1.2:5555|excluded');
    expect((await app1.connect('127.0.0.1', 15001, '')).data).toBe(''); // straight to the proxy's own port: not redirected again
    expect((await proxyUidApp1.connect('198.18.1.2', 80, 'from-proxy-uid')).data).toBe('198.18.1.2:80|from-proxy-uid');
    // only the direct loopback connection reached the proxy (as itself, orig = its own address)
    expect(proxy1.accepts().slice(n).every((a) => a.orig.endsWith(':15001'))).toBe(true);
  });

  it('treats 0.0.0.0 and :: as this host, as the routing iptables sees does (loopback: not redirected)', async () => {
    await app1.listen('127.0.0.1', 7070);
    await app1.listen('::1', 7070);
    const n = proxy1.accepts().length;
    expect((await app1.connect('0.0.0.0', 7070, 'any4')).data).toBe('127.0.0.1:7070|any4');
    expect((await app1.connect('::', 7070, 'any6')).data).toBe('[::1]:7070|any6');
    await new Promise((r) => setTimeout(r, 50));
    expect(proxy1.accepts().length, 'a connect to the unspecified address reached the proxy').toBe(n);
  });

  it('sends the proxy\'s connection to its own pod address to the inbound port', async () => {
    const n = proxy1.accepts().length;
    const r = await proxyUidApp1.connect('198.18.1.1', 8080, 'self');
    expect(r.data).toBe('198.18.1.1:8080|self');
    const a = proxy1.accepts().slice(n).find((x) => x.listener === 'inbound' && x.orig === '198.18.1.1:8080');
    expect(a).toBeDefined();
  });

  it('keeps original destinations apart for identical 4-tuples in two pods', async () => {
    const [n1, n2] = [proxy1.accepts().length, proxy2.accepts().length];
    const [r1, r2] = await Promise.all([
      app1.connect('198.18.1.2', 80, 'pod1', { address: '198.18.1.1', port: 40123 }),
      app2.connect('198.18.1.3', 80, 'pod2', { address: '198.18.1.1', port: 40123 }),
    ]);
    expect(r1.data).toBe('198.18.1.2:80|pod1');
    expect(r2.data).toBe('198.18.1.3:80|pod2');
    expect(proxy1.accepts().slice(n1).some((a) => a.peer === '127.0.0.1:40123' || a.peer.endsWith(':40123'))).toBe(true);
    expect(proxy2.accepts().slice(n2).filter((a) => a.peer.endsWith(':40123')).map((a) => a.orig)).toEqual(['198.18.1.3:80']);
  });

  it('leaves a non-meshed pod untouched', async () => {
    expect((await appPlain.connect('198.18.2.2', 80, 'plain')).data).toBe('198.18.2.2:80|plain');
  });

  it('applies includeOutboundIPRanges, excludeOutboundIPRanges and includeOutboundPorts', async () => {
    const cfg = istioCapture({
      ips: POD_IPS,
      annotations: {
        'traffic.sidecar.istio.io/includeOutboundIPRanges': '198.18.1.0/24,2001:db8:1::2/128',
        'traffic.sidecar.istio.io/excludeOutboundIPRanges': '198.18.1.4/32',
        'traffic.sidecar.istio.io/excludeOutboundPorts': '5555',
      },
    });
    await dp.register(pod1.path, cfg, POD_IPS);
    expect(await dp.check(pod1.path, cfg, POD_IPS)).toEqual([]);
    const n = proxy1.accepts().length;
    await app1.connect('198.18.1.2', 80, 'in');      // included
    await app1.connect('198.18.1.4', 80, 'ex');      // excluded CIDR wins
    await app1.connect('2001:db8:1::3', 80, 'no6');  // not in the v6 include list
    await app1.connect('2001:db8:1::2', 80, 'yes6'); // in it
    expect(proxy1.accepts().slice(n).map((a) => a.orig)).toEqual(['198.18.1.2:80', '[2001:db8:1::2]:80']);

    const portsOnly = istioCapture({
      ips: POD_IPS,
      annotations: { 'traffic.sidecar.istio.io/includeOutboundIPRanges': '', 'traffic.sidecar.istio.io/includeOutboundPorts': '5555' },
    });
    await dp.register(pod1.path, portsOnly, POD_IPS);
    expect(await dp.check(pod1.path, portsOnly, POD_IPS)).toEqual([]);
    const m = proxy1.accepts().length;
    await app1.connect('198.18.1.2', 80, 'not-included');
    await app1.connect('198.18.1.2', 5555, 'port-included');
    expect(proxy1.accepts().slice(m).map((a) => a.orig)).toEqual(['198.18.1.2:5555']);
    // back to the defaults for the tests after this one
    await dp.register(pod1.path, istioCapture({ ips: POD_IPS }), POD_IPS);
  });

  it('skips the lookups of a kind only for a pod that has none of it (mc_pods NO_OUT_* flags); an entry without the flags still gets every lookup', async () => {
    const NO_ALL = PodFlag.NO_OUT_XPORTS | PodFlag.NO_OUT_IPORTS | PodFlag.NO_OUT_XCIDRS;
    const key = Buffer.alloc(8);
    if (dp.ebpf) key.writeBigUInt64LE(await netnsCookie(pod1.path));
    // pod1's mc_pods entry, read (and rewritten) straight in the kernel's map
    const podEntry = (rewrite?: (v: McPod) => McPod): McPod => {
      const fd = bpf.objGet(`${dp.ebpf!.pinRoot}/maps/mc_pods`);
      try {
        const v = mcPod.decode(bpf.mapLookup(fd, key, mcPod.size)!);
        if (rewrite) bpf.mapUpdate(fd, key, mcPod.encode(rewrite(v)));
        return v;
      } finally {
        bpf.closeFd(fd);
      }
    };
    // '*' with an excluded range and no port lists: the two port lookups are
    // skipped, the CIDR lookup still runs.
    const cfg = istioCapture({
      ips: POD_IPS,
      annotations: { 'traffic.sidecar.istio.io/excludeOutboundIPRanges': '198.18.1.4/32', 'traffic.sidecar.istio.io/excludeOutboundPorts': '' },
    });
    await dp.register(pod1.path, cfg, POD_IPS);
    expect(await dp.check(pod1.path, cfg, POD_IPS)).toEqual([]);
    if (dp.ebpf) expect(podEntry().flags & NO_ALL).toBe(PodFlag.NO_OUT_XPORTS | PodFlag.NO_OUT_IPORTS);
    const n = proxy1.accepts().length;
    expect((await app1.connect('198.18.1.4', 80, 'ex')).data).toBe('198.18.1.4:80|ex');
    expect((await app1.connect('198.18.1.2', 5555, 'p')).data).toBe('198.18.1.2:5555|p');
    expect((await app1.connect('198.18.1.2', 80, 'q')).data).toBe('198.18.1.2:80|q');
    expect(proxy1.accepts().slice(n).map((a) => a.orig)).toEqual(['198.18.1.2:5555', '198.18.1.2:80']);

    // pod1's own settings (5555 excluded), its entry as an agent of the
    // version before wrote it: no NO_OUT_* flags, so every lookup runs.
    const own = istioCapture({ ips: POD_IPS, annotations: { 'traffic.sidecar.istio.io/excludeOutboundPorts': '5555' } });
    await dp.register(pod1.path, own, POD_IPS);
    if (dp.ebpf) {
      const written = podEntry((v) => ({ ...v, flags: v.flags & ~NO_ALL }));
      expect(written.flags & NO_ALL).toBe(PodFlag.NO_OUT_IPORTS | PodFlag.NO_OUT_XCIDRS);
      expect(podEntry().flags & NO_ALL).toBe(0);
    }
    const m = proxy1.accepts().length;
    expect((await app1.connect('198.18.1.2', 5555, 'old-ex')).data).toBe('198.18.1.2:5555|old-ex');
    expect((await app1.connect('198.18.1.4', 80, 'old-in')).data).toBe('198.18.1.4:80|old-in');
    expect(proxy1.accepts().slice(m).map((a) => a.orig)).toEqual(['198.18.1.4:80']);
    // the agent's check finds the entry differs, and writing it again repairs it
    if (dp.ebpf) expect((await dp.check(pod1.path, own, POD_IPS)).join('\n')).toMatch(/mc_pods entry .* differs/);
    await dp.register(pod1.path, own, POD_IPS);
    expect(await dp.check(pod1.path, own, POD_IPS)).toEqual([]);
  });

  it('captures DNS over UDP to the proxy and answers from the resolver the app asked', async () => {
    const dnsPod = await lab.netns('dns');
    const srvDns = await lab.netns('srvdns');
    await lab.link(dnsPod.name, srvDns.name, { a4: ['198.18.3.1/24'], b4: ['198.18.3.53/24'] });
    const app = await lab.agent(dnsPod.name);
    const proxy = await lab.proxy(dnsPod.name, ['--dns', '15053', '--no-ipv6']);
    await dp.register(dnsPod.path, istioCapture({ ips: ['198.18.3.1'], proxyEnv: { ISTIO_META_DNS_CAPTURE: 'true' }, ipv6: false }), ['198.18.3.1']);
    const r = await app.call<{ data: string; from: string }>('udpAsk', { host: '198.18.3.53', port: 53, payload: 'query' });
    expect(r.data).toBe('query'); // the proxy stand-in echoes
    expect(r.from).toBe('198.18.3.53:53');
    expect(proxy.lines.some((l) => l.includes('"event":"dns"'))).toBe(true);
  });

  it('rewrites the source of DNS replies from the proxy only, not of another datagram from port 15053 (IPv6)', async () => {
    const dnsPod = await lab.netns('dns6');
    const srvDns = await lab.netns('srvdns6');
    await lab.link(dnsPod.name, srvDns.name, { a4: ['198.18.3.101/24'], a6: ['2001:db8:3::1/64'], b4: ['198.18.3.102/24'], b6: ['2001:db8:3::53/64', '2001:db8:3::99/64'] });
    await lab.proxy(dnsPod.name, ['--dns', '15053']);
    await dp.register(dnsPod.path, istioCapture({ ips: ['2001:db8:3::1', '198.18.3.101'], proxyEnv: { ISTIO_META_DNS_CAPTURE: 'true' }, ipv6: true }), ['2001:db8:3::1', '198.18.3.101']);
    const script = fileURLToPath(new URL('./dns_reply_source.py', import.meta.url));
    const r = await execa('ip', ['netns', 'exec', dnsPod.name, 'python3', script, '2001:db8:3::53', srvDns.name, '2001:db8:3::99', '2001:db8:3::1']);
    const out = JSON.parse(r.stdout) as { reply_from: string; stranger_from: string };
    expect(out.reply_from, 'the proxy\'s reply shows the resolver the app asked').toBe('[2001:db8:3::53]:53');
    expect(out.stranger_from, 'a datagram from another host\'s port 15053 keeps its source').toBe('[2001:db8:3::99]:15053');
  });

  it('works with an unmodified third-party proxy (HAProxy reading SO_ORIGINAL_DST) as uid 1337', async () => {
    const cfg = path.join(tmp, 'haproxy.cfg');
    writeFileSync(cfg, [
      'global', '  maxconn 256', 'defaults', '  mode tcp', '  timeout connect 5s', '  timeout client 30s', '  timeout server 30s',
      // server address 0.0.0.0, port 0: connect to the connection's original destination
      'listen outbound', '  bind 127.0.0.1:15001', '  bind 0.0.0.0:15001', '  server original 0.0.0.0:0', '',
    ].join('\n'));
    const h = lab.spawn(pod3.name, ['haproxy', '-db', '-f', cfg], { uid: 1337 });
    await dp.register(pod3.path, istioCapture({ ips: ['198.18.1.1'], ipv6: false }), ['198.18.1.1']);
    let r: { data: string } | undefined;
    for (let i = 0; i < scaled(50) && !r; i++) {
      r = await app3.connect('198.18.1.3', 80, 'via-haproxy').catch(async () => {
        await new Promise((res) => setTimeout(res, 100));
        return undefined;
      });
    }
    expect(r?.data, h.stderr()).toBe('198.18.1.3:80|via-haproxy');
    if (dp.ebpf) {
      const st = dp.ebpf.stats(await netnsCookie(pod3.path))!;
      expect(st.outbound).toBeGreaterThan(0n);
      expect(st.origdst).toBeGreaterThan(0n);
    }
  });

  // A payload well past one segment arrives byte for byte (the byte order of
  // many connections under accept backlog: byte-order.test.ts).
  it('gives identical bytes end to end for a 20 KB payload', async () => {
    const payload = Array.from({ length: 20000 }, (_, i) => String.fromCharCode(33 + (i % 90))).join('');
    const r = await app1.connect('198.18.1.2', 80, payload);
    expect(r.data.length).toBe(`198.18.1.2:80|${payload}`.length);
    expect(r.data === `198.18.1.2:80|${payload}`).toBe(true);
  });

  it('goes straight to the destination after the pod is unregistered, leaving nothing behind', async () => {
    proxy1.proc.kill('SIGKILL');
    // iptables mode needs no cookie (and SO_NETNS_COOKIE does not exist before 5.14)
    const cookie1 = dp.ebpf ? await netnsCookie(pod1.path) : 0n;
    await dp.unregister(pod1.path);
    expect(await dp.leftovers(pod1.path)).toBe(0);
    expect((await app1.connect('198.18.1.2', 80, 'direct')).data).toBe('198.18.1.2:80|direct');
    if (!dp.ebpf) return;
    // no in-flight original destination left for this pod either
    const fd = bpf.objGet(`${dp.ebpf.pinRoot}/maps/mc_origdst`);
    const fd2 = bpf.objGet(`${dp.ebpf.pinRoot}/maps/mc_sockorig`);
    try {
      for (const f of [fd, fd2]) {
        const info = bpf.mapInfo(f);
        const left = bpf.mapKeys(f, info.keySize).map((k) => mcOrig.decode(bpf.mapLookup(f, k, info.valueSize)!)).filter((o) => o.netns === cookie1);
        expect(left).toEqual([]);
      }
    } finally {
      bpf.closeFd(fd);
      bpf.closeFd(fd2);
    }
  });
});
