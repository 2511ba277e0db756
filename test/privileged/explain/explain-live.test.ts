// `meshcap explain NAMESPACE/NAME` on a pod the agent really captured, in both
// modes: for each flow the kernel's verdict (eBPF maps decided as the
// programs decide / the live iptables rules) must agree with the rules and
// with what a real connection does (the proxy accepts it or the peer gets it
// directly); after the pod's capture is lost behind the agent's back, explain
// must say the kernel disagrees and exit 1.
import path from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { readRecords } from '../../../src/agent/state-store.js';
import { explainLive } from '../../../src/explain/live.js';
import type { Flow } from '../../../src/explain/explain.js';
import { projectRoot } from '../../../src/paths.js';
import { AgentFixture, loseCapture, podBesideServer } from '../../helpers/agent-fixture.js';
import { describeModes } from '../../helpers/datapaths.js';
import { Lab, scaled, type NsAgent } from '../../helpers/lab.js';
import { istioPod } from '../../helpers/pods.js';
import { cni, requireCniBinary } from '../agent/cni-harness.js';

const POD = '198.18.22.1';
const SERVER = '198.18.22.2';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describeModes('explain a live pod against the kernel, %s mode', (mode) => {
  const lab = new Lab();
  let fx: AgentFixture;
  let app: NsAgent;
  let appAsProxy: NsAgent;
  let server: NsAgent;
  let proxy: Awaited<ReturnType<Lab['proxy']>>;
  let pod: { name: string; path: string };

  beforeAll(async () => {
    requireCniBinary();
    fx = new AgentFixture(mode, [istioPod({ name: 'web', namespace: 'shop', annotations: {
      'traffic.sidecar.istio.io/excludeOutboundPorts': '81',
      'traffic.sidecar.istio.io/excludeInboundPorts': '9000',
    } })]);
    ({ pod, app, server } = await podBesideServer(lab, 'xl', { a4: [`${POD}/24`], b4: [`${SERVER}/24`] }, [SERVER]));
    await server.listen(SERVER, 81);
    await app.listen('0.0.0.0', 8080);
    await app.listen('0.0.0.0', 9000);
    appAsProxy = await lab.agent(pod.name, { uid: 1337 });
    await fx.start();
    const add = await cni('ADD', { socket: fx.socket, containerId: 'c-explain', netns: pod.path, pod: 'web', namespace: 'shop', podAddress: `${POD}/24` });
    expect(add.exitCode, add.stdout).toBe(0);
    proxy = await lab.proxy(pod.name);
  }, scaled(120_000));

  afterAll(async () => {
    await fx?.close();
    await lab.cleanup();
  });

  const explain = (flow: Omit<Flow, 'podIPs'>) => explainLive({ stateDir: fx.opts.stateDir, pinRoot: fx.pinRoot, namespace: 'shop', name: 'web', flow });
  const out = (port: number, uid = 1000): Omit<Flow, 'podIPs'> => ({ direction: 'outbound', peer: SERVER, port, protocol: 'tcp', uid, gid: uid });
  const inb = (port: number): Omit<Flow, 'podIPs'> => ({ direction: 'inbound', peer: SERVER, port, protocol: 'tcp', uid: 0, gid: 0 });

  /** Did the proxy accept this connection (matched by the client's local address)? Accept lines arrive over a pipe. */
  async function proxyAccepted(match: (a: { listener: string; peer: string; local: string }) => boolean): Promise<boolean> {
    for (let i = 0; i < 10; i++) {
      if (proxy.accepts().some(match)) return true;
      await sleep(50);
    }
    return false;
  }

  async function realOutbound(port: number, who: NsAgent): Promise<'captured' | 'not captured'> {
    const c = await who.connect(SERVER, port, 'x');
    expect(c.data, 'the connection reached the server, through the proxy or not').toBe(`${SERVER}:${port}|x`);
    return (await proxyAccepted((a) => a.listener !== 'inbound' && a.peer === c.local)) ? 'captured' : 'not captured';
  }

  async function realInbound(port: number): Promise<'captured' | 'not captured'> {
    const c = await server.connect(POD, port, 'y');
    expect(c.data).toBe(`${POD}:${port}|y`);
    return (await proxyAccepted((a) => a.listener === 'inbound' && a.peer === c.local)) ? 'captured' : 'not captured';
  }

  const cases: [string, () => Omit<Flow, 'podIPs'>, () => Promise<string>, string][] = [
    ['outbound to a captured port', () => out(80), () => realOutbound(80, app), 'captured'],
    ['outbound to an excluded port', () => out(81), () => realOutbound(81, app), 'not captured'],
    ['outbound from the proxy uid', () => out(80, 1337), () => realOutbound(80, appAsProxy), 'not captured'],
    ['inbound to an app port', () => inb(8080), () => realInbound(8080), 'captured'],
    ['inbound to an excluded port', () => inb(9000), () => realInbound(9000), 'not captured'],
  ];
  for (const [what, flow, real, want] of cases) {
    it(what, async () => {
      const r = await explain(flow());
      expect(r.agree, `${r.rules.reason}\nkernel: ${r.kernel.verdict} ${r.kernel.decidedBy}`).toBe(true);
      expect(r.kernel.verdict, r.kernel.decidedBy).toBe(want);
      expect(r.rules.verdict).toBe(want);
      expect(r.kernel.source).toMatch(mode === 'ebpf' ? /eBPF maps/ : /iptables rules live/);
      expect(await real(), 'what a real connection did').toBe(want);
    });
  }

  it('the CLI prints both verdicts and exits 0 while they agree', async () => {
    const r = await execa(process.execPath, [path.join(projectRoot, 'bin/meshcap'), 'explain', 'shop/web', '--to', `${SERVER}:80`,
      '--state-dir', fx.opts.stateDir, '--pin-root', fx.pinRoot], { reject: false });
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^pod shop\/web/);
    expect(r.stdout).toMatch(/kernel \(.*\): CAPTURED/);
    const none = await execa(process.execPath, [path.join(projectRoot, 'bin/meshcap'), 'explain', 'shop/nope', '--to', `${SERVER}:80`,
      '--state-dir', fx.opts.stateDir, '--pin-root', fx.pinRoot], { reject: false });
    expect(none.exitCode).toBe(1);
    expect(none.stderr).toMatch(/shop\/nope has no record/);
  });

  it('a pod whose capture was lost: the kernel disagrees, exit 1', async () => {
    const rec = readRecords(fx.opts.stateDir).records.find((x) => x.podName === 'web')!;
    await loseCapture(rec, fx.pinRoot);
    const r = await explain(out(80));
    expect(r.agree).toBe(false);
    expect(r.kernel.verdict).toBe('not captured');
    expect(await realOutbound(80, app)).toBe('not captured');
    const cli = await execa(process.execPath, [path.join(projectRoot, 'bin/meshcap'), 'explain', 'shop/web', '--to', `${SERVER}:80`,
      '--state-dir', fx.opts.stateDir, '--pin-root', fx.pinRoot, '--json'], { reject: false });
    expect(cli.exitCode).toBe(1);
    expect(JSON.parse(cli.stdout).agree).toBe(false);
  });
});
