// Inbound capture: connections arriving at a meshed pod reach the proxy's
// inbound listener (eBPF: the pod's sk_lookup program, no packet rewriting;
// iptables: Istio's ISTIO_INBOUND REDIRECT), which recovers the original
// destination and forwards to the app from 127.0.0.6 / ::6, as Envoy's inbound
// passthrough does.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { netnsCookie } from '../../../src/pod-netns.js';
import { Lab, scaled, type NsAgent } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';
import { describeModes, makeDriver, type Driver } from '../../helpers/datapaths.js';

describeModes('inbound capture, %s mode', (mode) => {
const lab = new Lab();
let dp: Driver;
let pod: { name: string; path: string };
let client: NsAgent;
let proxy: Awaited<ReturnType<Lab['proxy']>>;
const IPS = ['198.18.4.1', '2001:db8:4::1'];

beforeAll(async () => {
  dp = await makeDriver(mode);
  pod = await lab.netns('ipod');
  const cl = await lab.netns('icli');
  await lab.link(pod.name, cl.name, { a4: ['198.18.4.1/24'], a6: ['2001:db8:4::1/64'], b4: ['198.18.4.2/24'], b6: ['2001:db8:4::2/64'] });
  const app = await lab.agent(pod.name);
  for (const h of ['0.0.0.0', '::']) for (const p of [8080, 9090, 9091, 15021]) await app.listen(h, p);
  client = await lab.agent(cl.name);
  // CNI ADD runs before any container starts, so the pod is registered before
  // the proxy listens; sockops registers the inbound listener at listen().
  await dp.register(pod.path, istioCapture({ ips: IPS, annotations: { 'traffic.sidecar.istio.io/excludeInboundPorts': '9090' } }), IPS);
  // Envoy marks its inbound listener IP_TRANSPARENT in TPROXY mode (Istio grants
  // istio-proxy NET_ADMIN for it); iptables TPROXY needs that, eBPF does not
  proxy = mode === 'iptables' ? await lab.proxy(pod.name, ['--transparent'], 1337, ['net_admin']) : await lab.proxy(pod.name);
}, scaled(120_000));

afterAll(async () => {
  await lab.cleanup();
  await dp?.close();
});

const inboundAccepts = () => proxy.accepts().filter((a) => a.listener === 'inbound');

  it('steers a connection to the pod to the proxy\'s inbound listener with the original destination', async () => {
    const n = inboundAccepts().length;
    const r = await client.connect('198.18.4.1', 8080, 'in-v4');
    expect(r.data).toBe('198.18.4.1:8080|in-v4');
    const a = inboundAccepts().slice(n);
    expect(a.map((x) => x.orig)).toEqual(['198.18.4.1:8080']);
    if (dp.ebpf) {
      // no packet rewriting: the proxy's socket already has the original destination as its local address
      expect(a[0]!.local).toBe('198.18.4.1:8080');
      expect(dp.ebpf.stats(await netnsCookie(pod.path))!.inbound).toBeGreaterThan(0n);
    } else {
      expect(a[0]!.local).toBe('198.18.4.1:15006'); // REDIRECT rewrote it
    }
  });

  it('captures IPv6 too', async () => {
    const n = inboundAccepts().length;
    expect((await client.connect('2001:db8:4::1', 8080, 'in-v6')).data).toBe('[2001:db8:4::1]:8080|in-v6');
    expect(inboundAccepts().slice(n).map((x) => x.orig)).toEqual(['[2001:db8:4::1]:8080']);
  });

  it('lets 15021 and excludeInboundPorts reach their listeners directly', async () => {
    const n = inboundAccepts().length;
    expect((await client.connect('198.18.4.1', 15021, 'health')).data).toBe('198.18.4.1:15021|health');
    expect((await client.connect('198.18.4.1', 9090, 'excluded')).data).toBe('198.18.4.1:9090|excluded');
    expect(inboundAccepts().length).toBe(n);
  });

  it('captures only includeInboundPorts when it is a list', async () => {
    const cfg = istioCapture({ ips: IPS, annotations: { 'traffic.sidecar.istio.io/includeInboundPorts': '8080' } });
    await dp.register(pod.path, cfg, IPS);
    expect(await dp.check(pod.path, cfg, IPS)).toEqual([]);
    const n = inboundAccepts().length;
    await client.connect('198.18.4.1', 8080, 'listed');
    await client.connect('198.18.4.1', 9091, 'not-listed');
    expect(inboundAccepts().slice(n).map((x) => x.orig)).toEqual(['198.18.4.1:8080']);
  });

  it('gives TPROXY mode the original destination as the accepted socket\'s own address (eBPF mode refuses TPROXY, naming it)', async () => {
    const cfg = istioCapture({ ips: IPS, annotations: { 'sidecar.istio.io/interceptionMode': 'TPROXY' } });
    if (mode === 'ebpf') {
      // Envoy's TPROXY upstream (client source, mark 1337) would loop through
      // the connect hook: such pods get iptables mode (decision.ts) instead.
      await expect(dp.register(pod.path, cfg, IPS)).rejects.toThrow(/TPROXY.*not supported in eBPF mode/);
      const earlier = istioCapture({ ips: IPS, annotations: { 'traffic.sidecar.istio.io/includeInboundPorts': '8080' } });
      expect(await dp.check(pod.path, earlier, IPS), 'a refused register leaves the earlier config in place').toEqual([]);
      return;
    }
    await dp.register(pod.path, cfg, IPS);
    const n = inboundAccepts().length;
    expect((await client.connect('198.18.4.1', 9091, 'tproxy')).data).toBe('198.18.4.1:9091|tproxy');
    const a = inboundAccepts().slice(n);
    expect(a.map((x) => [x.local, x.orig])).toEqual([['198.18.4.1:9091', '198.18.4.1:9091']]);
  });

  it('carries 1000 concurrent connections byte for byte', async () => {
    await dp.register(pod.path, istioCapture({ ips: IPS }), IPS);
    const n = inboundAccepts().length;
    const r = await client.call<{ ok: number; bad: string[] }>('connectMany', { host: '198.18.4.1', port: 8080, count: 1000, payloadBytes: 2000, timeoutMs: 60_000 });
    expect(r.bad).toEqual([]);
    expect(r.ok).toBe(1000);
    expect(inboundAccepts().length - n).toBe(1000);
  });

  it('works with an unmodified third-party proxy inbound (HAProxy, original destination, source 127.0.0.6)', async () => {
    const hpod = await lab.netns('hpod');
    const hcl = await lab.netns('hcli');
    await lab.link(hpod.name, hcl.name, { a4: ['198.18.5.1/24'], b4: ['198.18.5.2/24'] });
    const app = await lab.agent(hpod.name);
    await app.listen('0.0.0.0', 8080);
    const cli = await lab.agent(hcl.name);
    await dp.register(hpod.path, istioCapture({ ips: ['198.18.5.1'], ipv6: false }), ['198.18.5.1']);
    const dir = mkdtempSync(path.join(os.tmpdir(), 'meshcap-haproxy-in-'));
    chmodSync(dir, 0o755); // haproxy runs as the proxy uid
    try {
      const cfg = path.join(dir, 'haproxy.cfg');
      writeFileSync(cfg, [
        'global', '  maxconn 256', 'defaults', '  mode tcp', '  timeout connect 5s', '  timeout client 30s', '  timeout server 30s',
        // 0.0.0.0:0 = the connection's original destination; Envoy-style passthrough source
        'listen inbound', '  bind 0.0.0.0:15006', '  server original 0.0.0.0:0 source 127.0.0.6', '',
      ].join('\n'));
      const h = lab.spawn(hpod.name, ['haproxy', '-db', '-f', cfg], { uid: 1337 });
      let r: { data: string } | undefined;
      for (let i = 0; i < scaled(50) && !r; i++) {
        r = await cli.connect('198.18.5.1', 8080, 'haproxy-in').catch(async () => {
          await new Promise((res) => setTimeout(res, 100));
          return undefined;
        });
      }
      // the app answered (its own address) through haproxy: the client never reaches 8080 directly while captured
      expect(r?.data, h.stderr()).toBe('198.18.5.1:8080|haproxy-in');
      if (dp.ebpf) expect(dp.ebpf.stats(await netnsCookie(hpod.path))!.inbound).toBeGreaterThan(0n);
      h.proc.kill('SIGKILL');
      // and with the proxy gone, a captured port is refused rather than bypassing it
      await expect(cli.connect('198.18.5.1', 8080, 'no-proxy')).rejects.toThrow(/ECONNREFUSED|ECONNRESET/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('goes straight to the app once the pod is unregistered, leaving nothing behind', async () => {
    await dp.unregister(pod.path);
    expect(await dp.leftovers(pod.path)).toBe(0);
    const n = inboundAccepts().length;
    expect((await client.connect('198.18.4.1', 8080, 'direct')).data).toBe('198.18.4.1:8080|direct');
    expect(inboundAccepts().length).toBe(n);
  });
});
