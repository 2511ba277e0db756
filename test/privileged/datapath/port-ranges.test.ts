// Wide port lists (issue 16, item 10): a pod excluding 100 consecutive ports
// outbound and 100 inbound costs two mc_portranges entries in eBPF mode, not
// 200 entries of the node-wide mc_ports table, and the ports inside, at the
// edges and outside the ranges meet the same fate in both modes.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { netnsCookie } from '../../../src/pod-netns.js';
import { describeModes, makeDriver, type Driver } from '../../helpers/datapaths.js';
import { Lab, scaled, type NsAgent } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

const POD = '198.18.27.1';
const SRV = '198.18.27.2';
const list = (from: number, n: number) => Array.from({ length: n }, (_, i) => String(from + i)).join(',');

describeModes('wide port lists, %s mode', (mode) => {
  const lab = new Lab();
  let dp: Driver;
  let app: NsAgent;
  let server: NsAgent;
  let pod: { name: string; path: string };
  let proxy: Awaited<ReturnType<Lab['proxy']>>;

  beforeAll(async () => {
    dp = await makeDriver(mode);
    pod = await lab.netns('pr');
    const srv = await lab.netns('prsrv');
    await lab.link(pod.name, srv.name, { a4: [`${POD}/24`], b4: [`${SRV}/24`] });
    server = await lab.agent(srv.name);
    for (const p of [80, 19999, 20000, 20099, 20100]) await server.listen(SRV, p);
    app = await lab.agent(pod.name);
    for (const p of [8080, 30000, 30050, 30099]) await app.listen('0.0.0.0', p);
    await dp.register(pod.path, istioCapture({ ips: [POD], ipv6: false, annotations: {
      'traffic.sidecar.istio.io/excludeOutboundPorts': list(20000, 100),
      'traffic.sidecar.istio.io/excludeInboundPorts': list(30000, 100),
    } }), [POD]);
    proxy = await lab.proxy(pod.name);
  }, scaled(120_000));

  afterAll(async () => {
    await dp?.close();
    await lab.cleanup();
  });

  async function accepted(listener: 'inbound' | 'outbound', peer: string): Promise<boolean> {
    for (let i = 0; i < 10; i++) {
      if (proxy.accepts().some((a) => (listener === 'inbound') === (a.listener === 'inbound') && a.peer === peer)) return true;
      await new Promise((r) => setTimeout(r, 50));
    }
    return false;
  }

  it('outbound: ports inside the excluded range (edges included) go direct, the ports around it are captured', async () => {
    const fate: Record<number, boolean> = {};
    for (const p of [80, 19999, 20000, 20099, 20100]) {
      const c = await app.connect(SRV, p, 'x');
      expect(c.data).toBe(`${SRV}:${p}|x`);
      fate[p] = await accepted('outbound', c.local);
    }
    expect(fate).toEqual({ 80: true, 19999: true, 20000: false, 20099: false, 20100: true });
  });

  it('inbound: the excluded range reaches the app directly, other ports go through the sidecar', async () => {
    const fate: Record<number, boolean> = {};
    for (const p of [8080, 30000, 30050, 30099]) {
      const c = await server.connect(POD, p, 'y');
      expect(c.data).toBe(`${POD}:${p}|y`);
      fate[p] = await accepted('inbound', c.local);
    }
    expect(fate).toEqual({ 8080: true, 30000: false, 30050: false, 30099: false });
  });

  it('eBPF mode stores each list as one range, none of its ports in mc_ports', async () => {
    if (mode !== 'ebpf') return;
    const maps = (dp.ebpf as unknown as { maps: { keysOf(m: string, n: bigint): Buffer[] } }).maps;
    const cookie = await netnsCookie(pod.path);
    expect(maps.keysOf('mc_portranges', cookie)).toHaveLength(2);
    expect(maps.keysOf('mc_ports', cookie).length).toBeLessThan(10); // Istio's own few (15020, 15021, 15090 ...)
  });
});
