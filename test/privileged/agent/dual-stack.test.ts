// Dual-stack pods follow Istio's rule in both modes: IPv6 is captured when the
// pod has only IPv6 addresses, or when ISTIO_DUAL_STACK is on (istio-cni asks
// the pod's namespace, which lists IPv4 first: checked against istio-cni's own
// code in test/privileged/istio-diff/pods.test.ts); a dual-stack pod
// without dual stack keeps its IPv6 connections direct (iptables mode renders
// no ip6tables rules for it; eBPF mode used to capture them anyway, sending
// them to a proxy that may listen on 0.0.0.0 only).
import { afterAll, beforeAll, expect, it } from 'vitest';
import { AgentFixture, cniRequest, podBesideServer } from '../../helpers/agent-fixture.js';
import { describeModes } from '../../helpers/datapaths.js';
import { Lab, scaled, type NsAgent } from '../../helpers/lab.js';
import { istioPod } from '../../helpers/pods.js';

describeModes('dual-stack pods follow Istio\'s IPv6 rule, %s mode', (mode) => {
  const lab = new Lab();
  let fx: AgentFixture;
  let app: NsAgent;
  let proxy: Awaited<ReturnType<Lab['proxy']>>;
  let pod: { name: string; path: string };
  const V4 = '198.18.40.1';
  const V6 = '2001:db8:40::1';

  beforeAll(async () => {
    fx = new AgentFixture(mode, [istioPod({ name: 'ds' }), istioPod({ name: 'ds-on', proxyEnv: { ISTIO_DUAL_STACK: 'true' } })]);
    ({ pod, app } = await podBesideServer(lab, 'ds', { a4: [`${V4}/24`], a6: [`${V6}/64`], b4: ['198.18.40.2/24'], b6: ['2001:db8:40::2/64'] }, ['198.18.40.2', '2001:db8:40::2']));
    await fx.start();
    proxy = await lab.proxy(pod.name);
  }, scaled(120_000));

  afterAll(async () => {
    await fx?.close();
    await lab.cleanup();
  });

  const req = (command: 'ADD' | 'DEL', podName: string, ips: string[]) => cniRequest(command, { containerId: 'c-ds', netns: pod.path, pod: podName, ips });

  /** Which of an IPv4 and an IPv6 connection reached the proxy. */
  async function captured(): Promise<{ v4: boolean; v6: boolean }> {
    const out = { v4: false, v6: false };
    for (const [fam, dst] of [['v4', '198.18.40.2'], ['v6', '2001:db8:40::2']] as const) {
      const before = proxy.accepts().length;
      const r = await app.connect(dst, 80, fam);
      expect(r.data).toMatch(new RegExp(`\\|${fam}$`));
      await new Promise((res) => setTimeout(res, 50));
      out[fam] = proxy.accepts().length > before;
    }
    return out;
  }

  const cases: [string, string, string[], { v4: boolean; v6: boolean }][] = [
    ['v4 first, dual stack off: IPv6 stays direct', 'ds', [`${V4}/24`, `${V6}/64`], { v4: true, v6: false }],
    ['v6 first, dual stack off: IPv6 stays direct too (istio-cni sees the IPv4 address first)', 'ds', [`${V6}/64`, `${V4}/24`], { v4: true, v6: false }],
    ['v4 first with ISTIO_DUAL_STACK: both captured', 'ds-on', [`${V4}/24`, `${V6}/64`], { v4: true, v6: true }],
  ];
  for (const [title, name, ips, want] of cases) {
    it(title, async () => {
      await fx.agent.handlers.add(req('ADD', name, ips));
      try {
        expect(fx.agent.store.get('c-ds', 'eth0')!.mode).toBe(mode);
        expect(await captured()).toEqual(want);
      } finally {
        await fx.agent.handlers.del(req('DEL', name, ips));
      }
    });
  }
});
