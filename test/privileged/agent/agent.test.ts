// The agent from a container runtime's point of view, on the real kernel: the
// real meshcap-cni binary exec'd with CNI env + stdin against an agent serving
// a pods file, pods that are network namespaces this test made, real
// connections through the reference proxy. Same flow in eBPF and iptables mode.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { Writable } from 'node:stream';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { pino } from 'pino';
import { stringify } from 'yaml';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { V1Pod } from '@kubernetes/client-node';
import { startAgent, type Agent } from '../../../src/agent/agent.js';
import { configOf, cookieOf } from '../../../src/agent/state-store.js';
import { checkCapture } from '../../../src/fallback-iptables/apply.js';
import { FileSource } from '../../../src/kube/file-source.js';
import { uninstallDatapath } from '../../../src/loader/datapath.js';
import { netnsCookie } from '../../../src/pod-netns.js';
import { projectRoot } from '../../../src/paths.js';
import { Lab, scaled, testPinRoot, type NsAgent } from '../../helpers/lab.js';
import { istioPod } from '../../helpers/pods.js';
import { describeModes } from '../../helpers/datapaths.js';
import { cni, requireCniBinary, type CniCall } from './cni-harness.js';
import { loseCapture } from '../../helpers/agent-fixture.js';

function plainPod(name: string): V1Pod {
  return { apiVersion: 'v1', kind: 'Pod', metadata: { name, namespace: 'default' }, spec: { containers: [{ name: 'app', image: 'app' }] } };
}

describeModes('meshcap agent, %s mode', (mode) => {
  const lab = new Lab();
  const pinRoot = testPinRoot();
  let tmp: string;
  let podsFile: string;
  let agent: Agent;
  let app: NsAgent;
  let proxy: Awaited<ReturnType<Lab['proxy']>>;
  let pod: { name: string; path: string };
  let plain: { name: string; path: string };
  const logs: Record<string, unknown>[] = [];
  let base: Omit<CniCall, 'containerId'>;
  const pods: V1Pod[] = [istioPod({ name: 'web' }), plainPod('plain'), istioPod({ name: 'gone' }), istioPod({ name: 'gc-a' }), istioPod({ name: 'gc-b' })];
  const writePods = () => writeFileSync(podsFile, pods.map((p) => stringify(p)).join('---\n'));

  beforeAll(async () => {
    requireCniBinary();
    tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-agent-'));
    podsFile = path.join(tmp, 'pods.yaml');
    writePods();
    pod = await lab.netns('web');
    plain = await lab.netns('plain');
    const srv = await lab.netns('srv');
    await lab.link(pod.name, srv.name, { a4: ['198.18.7.1/24'], b4: ['198.18.7.2/24'] });
    const server = await lab.agent(srv.name);
    await server.listen('198.18.7.2', 80);
    app = await lab.agent(pod.name);
    proxy = await lab.proxy(pod.name);
    const logger = pino({ level: 'debug' }, new Writable({
      write(chunk: Buffer, _e, cb) {
        for (const l of chunk.toString().split('\n')) if (l) logs.push(JSON.parse(l) as Record<string, unknown>);
        cb();
      },
    }));
    agent = await startAgent({
      socketPath: path.join(tmp, 'run', 'cni.sock'),
      pinRoot,
      mode,
      stateDir: path.join(tmp, 'state'),
      podSource: new FileSource({ path: podsFile, logger, debounceMs: 20, pollIntervalMs: 200 }),
      excludeNamespaces: ['kube-system'],
      logger,
      metricsAddr: '127.0.0.1:0',
      podWaitMs: 1500,
    });
    expect(agent.mode).toBe(mode);
    base = { socket: path.join(tmp, 'run', 'cni.sock'), netns: pod.path, pod: 'web', podAddress: '198.18.7.1/24' };
  }, scaled(120_000));

  afterAll(async () => {
    await agent?.close();
    await lab.cleanup();
    uninstallDatapath(pinRoot);
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  /** The datapath state of a recorded attachment, checked independently of the agent. */
  async function liveProblems(containerId: string): Promise<string[]> {
    const rec = agent.store.get(containerId, 'eth0');
    if (!rec) return ['no record'];
    if (mode === 'ebpf') return agent.ebpf!.checkEntries(cookieOf(rec)!, configOf(rec), rec.podIPs);
    return (await checkCapture(rec.netns, configOf(rec))).differences;
  }

  async function iptablesRules(netns: string): Promise<number> {
    const { stdout } = await execa('nsenter', [`--net=${netns}`, 'iptables-save']);
    return stdout.split('\n').filter((l) => l.includes('ISTIO_')).length;
  }

  async function datapathHas(netns: string): Promise<boolean> {
    if (mode === 'ebpf') return agent.ebpf!.leftovers(await netnsCookie(netns)) > 0;
    return (await iptablesRules(netns)) > 0;
  }

  const acceptedFor = (orig: string) => proxy.accepts().filter((a) => a.orig === orig).length;

  it('ADD for a meshed pod sets up the redirect before answering, and answers prevResult', async () => {
    const r = await cni('ADD', { ...base, containerId: 'c-web' });
    expect(r.exitCode, r.stdout).toBe(0);
    expect(r.json).toMatchObject({ cniVersion: '1.1.0', ips: [{ address: '198.18.7.1/24', interface: 0 }] });
    const rec = agent.store.get('c-web', 'eth0')!;
    expect(rec).toMatchObject({ podNamespace: 'default', podName: 'web', netns: pod.path, mode, profile: 'istio', podIPs: ['198.18.7.1'] });
    expect(await liveProblems('c-web')).toEqual([]);

    const before = acceptedFor('198.18.7.2:80');
    expect((await app.connect('198.18.7.2', 80, 'via-proxy')).data).toBe('198.18.7.2:80|via-proxy');
    expect(acceptedFor('198.18.7.2:80')).toBe(before + 1);
  });

  it('a retried ADD is idempotent', async () => {
    const again = await cni('ADD', { ...base, containerId: 'c-web' });
    expect(again.exitCode, again.stdout).toBe(0);
    expect(agent.store.list().filter((r) => r.containerId === 'c-web')).toHaveLength(1);
    expect(await liveProblems('c-web')).toEqual([]);
    if (mode === 'iptables') {
      // one copy of the rules, not two
      const { stdout } = await execa('nsenter', [`--net=${pod.path}`, 'iptables-save']);
      expect(stdout.split('\n').filter((l) => l.startsWith('-A OUTPUT') && l.includes('ISTIO_OUTPUT'))).toHaveLength(1);
    }
  });

  it('meshcap status shows the pod with its mode, settings and live counters', async () => {
    // (a retried ADD re-applies iptables rules atomically, which resets their counters)
    expect((await app.connect('198.18.7.2', 80, 'counted')).data).toBe('198.18.7.2:80|counted');
    const r = await execa(process.execPath, [path.join(projectRoot, 'bin/meshcap'), 'status', '--json', '--state-dir', agent.store.dir, '--pin-root', pinRoot]);
    const report = JSON.parse(r.stdout) as { pods: { namespace: string; name: string; mode: string; profile: string; state: string; netns: string; connections: { outbound: number } | null; capture: { outboundPort: string; inboundPorts: string } }[] };
    const web = report.pods.find((p) => p.name === 'web')!;
    expect(web).toMatchObject({ namespace: 'default', mode, profile: 'istio', state: 'present', netns: pod.path, capture: { outboundPort: '15001', inboundPorts: '*' } });
    expect(web.connections!.outbound).toBeGreaterThan(0);
    const text = await execa(process.execPath, [path.join(projectRoot, 'bin/meshcap'), 'status', '--state-dir', agent.store.dir, '--pin-root', pinRoot]);
    expect(text.stdout).toMatch(new RegExp(`default/web\\s+${mode}\\s+istio`));
  });

  it('CHECK passes, then fails listing what is missing once the state is removed behind the agent\'s back', async () => {
    const ok = await cni('CHECK', { ...base, containerId: 'c-web' });
    expect(ok.exitCode, ok.stdout).toBe(0);
    const removed = await loseCapture(agent.store.get('c-web', 'eth0')!, pinRoot);
    if (mode === 'ebpf') expect(removed).toBeGreaterThan(0);
    const bad = await cni('CHECK', { ...base, containerId: 'c-web' });
    expect(bad.exitCode).toBe(1);
    expect(bad.json!.code).toBe(101);
    expect(bad.json!.msg).toContain('default/web');
    expect(bad.json!.msg).toMatch(mode === 'ebpf' ? /no mc_pods entry/ : /missing chain: -t nat ISTIO_OUTPUT/);
    // The runtime's answer to a failed CHECK: ADD again, which repairs it.
    expect((await cni('ADD', { ...base, containerId: 'c-web' })).exitCode).toBe(0);
    expect((await cni('CHECK', { ...base, containerId: 'c-web' })).exitCode).toBe(0);
  });

  it('ADD for an unmeshed pod succeeds and writes nothing', async () => {
    const r = await cni('ADD', { ...base, containerId: 'c-plain', netns: plain.path, pod: 'plain', podAddress: '198.18.8.1/24' });
    expect(r.exitCode, r.stdout).toBe(0);
    expect(r.json).toMatchObject({ ips: [{ address: '198.18.8.1/24' }] });
    expect(agent.store.get('c-plain', 'eth0')).toBeUndefined();
    expect(await datapathHas(plain.path)).toBe(false);
    expect((await cni('CHECK', { ...base, containerId: 'c-plain', netns: plain.path, pod: 'plain' })).exitCode).toBe(0);
    expect((await cni('DEL', { ...base, containerId: 'c-plain', netns: plain.path, pod: 'plain' })).exitCode).toBe(0);
  });

  it('ADD for a pod in an excluded namespace succeeds at once, untouched', async () => {
    const r = await cni('ADD', { ...base, containerId: 'c-sys', netns: plain.path, namespace: 'kube-system', pod: 'coredns' });
    expect(r.exitCode, r.stdout).toBe(0);
    expect(r.ms).toBeLessThan(1000); // no wait for a pod object
    expect(agent.store.get('c-sys', 'eth0')).toBeUndefined();
    expect(await datapathHas(plain.path)).toBe(false);
  });

  it('ADD for a pod nobody knows fails with 11 (try again) naming the pod, after the bounded wait', async () => {
    const r = await cni('ADD', { ...base, containerId: 'c-ghost', pod: 'ghost' });
    expect(r.exitCode).toBe(1);
    expect(r.json).toMatchObject({ code: 11, msg: expect.stringContaining('default/ghost') });
    expect(r.ms).toBeGreaterThanOrEqual(1400);
    expect(r.ms).toBeLessThan(8000);
  });

  it('ADD waits for a pod that appears in the pod source meanwhile', async () => {
    const late = await lab.netns('late');
    const p = cni('ADD', { ...base, containerId: 'c-late', netns: late.path, pod: 'late', podAddress: '198.18.9.1/24' });
    await new Promise((r) => setTimeout(r, 300));
    pods.push(istioPod({ name: 'late' }));
    writePods();
    const r = await p;
    expect(r.exitCode, r.stdout).toBe(0);
    expect(await liveProblems('c-late')).toEqual([]);
    expect((await cni('DEL', { ...base, containerId: 'c-late', netns: late.path, pod: 'late' })).exitCode).toBe(0);
  });

  it('DEL removes the redirect and the record; traffic goes direct; DEL again succeeds', async () => {
    // iptables mode needs no cookie (SO_NETNS_COOKIE does not exist before 5.14)
    const cookie = mode === 'ebpf' ? await netnsCookie(pod.path) : 0n;
    const r = await cni('DEL', { ...base, containerId: 'c-web' });
    expect(r.exitCode, r.stdout).toBe(0);
    expect(r.stdout).toBe('');
    expect(agent.store.get('c-web', 'eth0')).toBeUndefined();
    if (mode === 'ebpf') expect(agent.ebpf!.leftovers(cookie)).toBe(0);
    else expect(await iptablesRules(pod.path)).toBe(0);

    const before = proxy.accepts().length;
    expect((await app.connect('198.18.7.2', 80, 'direct')).data).toBe('198.18.7.2:80|direct');
    expect(proxy.accepts().length).toBe(before);

    const again = await cni('DEL', { ...base, containerId: 'c-web' });
    expect(again.exitCode, again.stdout).toBe(0);
  });

  it('DEL after the netns was deleted succeeds and leaves nothing behind', async () => {
    const ns = await lab.netns('gone');
    const call = { ...base, containerId: 'c-gone', netns: ns.path, pod: 'gone', podAddress: '198.18.10.1/24' };
    expect((await cni('ADD', call)).exitCode).toBe(0);
    const cookie = cookieOf(agent.store.get('c-gone', 'eth0')!)!;
    await execa('ip', ['netns', 'del', ns.name]);
    // the runtime may pass the old path or none at all
    const r = await cni('DEL', { ...call, netns: '' });
    expect(r.exitCode, r.stdout).toBe(0);
    expect(agent.store.get('c-gone', 'eth0')).toBeUndefined();
    if (mode === 'ebpf') expect(agent.ebpf!.leftovers(cookie)).toBe(0);
  });

  it('GC removes attachments not in cni.dev/valid-attachments and keeps the rest', async () => {
    const a = await lab.netns('gca');
    const b = await lab.netns('gcb');
    expect((await cni('ADD', { ...base, containerId: 'c-gca', netns: a.path, pod: 'gc-a', podAddress: '198.18.11.1/24' })).exitCode).toBe(0);
    expect((await cni('ADD', { ...base, containerId: 'c-gcb', netns: b.path, pod: 'gc-b', podAddress: '198.18.12.1/24' })).exitCode).toBe(0);
    const r = await cni('GC', { socket: base.socket, extra: { 'cni.dev/valid-attachments': [{ containerID: 'c-gca', ifname: 'eth0' }] } });
    expect(r.exitCode, r.stdout).toBe(0);
    expect(agent.store.get('c-gca', 'eth0')).toBeDefined();
    expect(agent.store.get('c-gcb', 'eth0')).toBeUndefined();
    expect(await datapathHas(a.path)).toBe(true);
    expect(await datapathHas(b.path)).toBe(false);
    expect((await cni('DEL', { ...base, containerId: 'c-gca', netns: a.path, pod: 'gc-a' })).exitCode).toBe(0);
    expect(await datapathHas(a.path)).toBe(false);
  });

  it('STATUS says ready; /healthz, /readyz and /metrics answer', async () => {
    const s = await cni('STATUS', { socket: base.socket });
    expect(s.exitCode, s.stdout).toBe(0);
    const url = `http://127.0.0.1:${agent.http!.address.port}`;
    expect((await fetch(`${url}/healthz`)).status).toBe(200);
    expect(await (await fetch(`${url}/readyz`)).text()).toBe('ready\n');
    const m = await (await fetch(`${url}/metrics`)).text();
    expect(m).toMatch(/meshcap_cni_requests_total\{verb="ADD",result="ok"\} \d+/);
    expect(m).toMatch(/meshcap_cni_requests_total\{verb="ADD",result="error_11"\} 1/);
    expect(m).toMatch(/meshcap_cni_request_duration_seconds_count\{verb="DEL"\} \d+/);
    expect(m).toMatch(new RegExp(`meshcap_pods\\{mode="${mode}"\\} 0`));
  });

  it('logs one line per CNI request, and errors with their cause', () => {
    const reqLines = logs.filter((l) => l.msg === 'cni request');
    expect(reqLines.length).toBeGreaterThan(10);
    const ghost = reqLines.filter((l) => l.podName === 'ghost');
    expect(ghost).toHaveLength(1);
    expect(ghost[0]).toMatchObject({ verb: 'ADD', result: 'error', code: 11, error: expect.stringContaining('default/ghost') });
    const adds = reqLines.filter((l) => l.verb === 'ADD' && l.result === 'ok');
    expect(adds.some((l) => l.decision === 'meshed' && l.mode === mode && typeof l.durationMs === 'number')).toBe(true);
    expect(adds.some((l) => String(l.decision).startsWith('not meshed: '))).toBe(true);
    expect(logs.filter((l) => l.msg === 'meshcap agent ready')).toHaveLength(1);
  });
});
