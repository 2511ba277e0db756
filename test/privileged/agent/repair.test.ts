// Repair (issue 13): a meshed pod that started while meshcap-cni was not in
// the chain runs with its sidecar but without capture. The agent finds it
// from the pod list, its own records and the kernel (the pod UID in a
// process's cgroup path, that process's netns), captures it in place through
// that netns, records it, posts an Event and counts it. A real netns and a
// real cgroup stand in for the pod sandbox; the proxy runs before the agent
// knows the pod, as it would.
import { execa, type ResultPromise } from 'execa';
import { mkdirSync, rmdirSync, writeFileSync, readFileSync } from 'node:fs';
import { randomBytes, randomUUID } from 'node:crypto';
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { RepairActions } from '../../../src/agent/repair.js';
import { cgroup2OrThrow } from '../../../src/loader/mounts.js';
import { AgentFixture, podBesideServer } from '../../helpers/agent-fixture.js';
import { describeModes } from '../../helpers/datapaths.js';
import { Lab, scaled, type NsAgent } from '../../helpers/lab.js';
import { istioPod } from '../../helpers/pods.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Records what repair asks of the cluster (the standalone agent has no API server; the calls are ApiSource's, covered in test/k8s). */
class EventLog implements RepairActions {
  events: { pod: string; type: string; reason: string; message: string }[] = [];
  async podEvent(ns: string, name: string, type: 'Normal' | 'Warning', reason: string, message: string) {
    this.events.push({ pod: `${ns}/${name}`, type, reason, message });
  }
  async labelPod() {
    throw new Error('not in this test');
  }
  async deletePod() {
    throw new Error('not in this test');
  }
}

describeModes('repair of a meshed pod that started without capture, %s mode', (mode) => {
  const lab = new Lab();
  const uid = randomUUID();
  const cgParent = path.join(cgroup2OrThrow(), `meshcap-test-repair-${process.pid}-${randomBytes(3).toString('hex')}`);
  const cgPod = path.join(cgParent, `pod${uid}`);
  const sandboxId = randomBytes(32).toString('hex');
  const cgSandbox = path.join(cgPod, sandboxId);
  let fx: AgentFixture;
  let app: NsAgent;
  let server: NsAgent;
  let pause: ResultPromise | undefined;
  let proxy: Awaited<ReturnType<Lab['proxy']>>;
  const events = new EventLog();

  beforeAll(async () => {
    ({ app, server, pod: { name: ns } } = await podBesideServer(lab, 'rp', { a4: ['198.18.23.1/24'], b4: ['198.18.23.2/24'] }, ['198.18.23.2']));
    await app.listen('0.0.0.0', 8080);
    // the pod's "pause" process: in the pod netns and in a cgroup named after the pod UID
    pause = execa('ip', ['netns', 'exec', ns, 'sleep', '600'], { reject: false });
    await sleep(100);
    mkdirSync(cgSandbox, { recursive: true });
    writeFileSync(path.join(cgSandbox, 'cgroup.procs'), String(pause.pid));
    expect(readFileSync(`/proc/${pause.pid}/cgroup`, 'utf8')).toContain(`pod${uid}`);
    // the sidecar runs already: the pod started before meshcap was in the chain
    proxy = await lab.proxy(ns);
    const pod = istioPod({ name: 'late', ips: ['198.18.23.1'] });
    pod.metadata!.uid = uid;
    pod.status!.phase = 'Running';
    const ghost = istioPod({ name: 'ghost', ips: ['198.18.23.9'] });
    ghost.metadata!.uid = randomUUID(); // no process of it runs here
    ghost.status!.phase = 'Running';
    fx = new AgentFixture(mode, [pod, ghost], { repair: 'off', repairActions: events });
    await fx.start();
  }, scaled(120_000));
  let ns = '';

  afterAll(async () => {
    await fx?.close();
    pause?.kill('SIGKILL');
    await pause?.catch(() => undefined);
    await lab.cleanup();
    for (const d of [cgSandbox, cgPod, cgParent]) {
      try {
        rmdirSync(d);
      } catch { /* already gone */ }
    }
  });

  async function outboundViaProxy(tag: string): Promise<boolean> {
    const before = proxy.accepts().length;
    const r = await app.connect('198.18.23.2', 80, tag);
    expect(r.data).toBe(`198.18.23.2:80|${tag}`);
    for (let i = 0; i < 20; i++) {
      if (proxy.accepts().slice(before).some((a) => a.peer === r.local)) return true;
      await sleep(50);
    }
    return false;
  }

  it('before repair the pod\'s connections go direct (that is the bug repair fixes)', async () => {
    expect(await outboundViaProxy('before')).toBe(false);
  });

  it('repairs it in place through the netns of the pod\'s oldest process, records it, posts an Event and counts it', async () => {
    const fresh = await fx.restart({ repair: 'repair', repairActions: events });
    const out = await fresh.repair();
    const late = out.find((o) => o.pod === 'default/late');
    expect(late, JSON.stringify(out)).toMatchObject({ action: 'repair', outcome: 'ok' });
    expect(late!.detail).toContain(`/proc/${pause!.pid}/ns/net`);
    const rec = fresh.store.list().find((r) => r.podName === 'late')!;
    expect(rec).toMatchObject({ containerId: sandboxId, podUid: uid, netns: `/proc/${pause!.pid}/ns/net`, mode });
    expect(events.events.find((e) => e.pod === 'default/late')).toMatchObject({ type: 'Warning', reason: 'MeshcapRepaired' });
    const metrics = await fresh.metrics.registry.getSingleMetricAsString('meshcap_repair_pods_total');
    expect(metrics).toContain('meshcap_repair_pods_total{action="repair",outcome="ok"} 1');
  });

  it('new outbound connections now go through the sidecar, and inbound ones too', async () => {
    for (let i = 0; i < 3; i++) expect(await outboundViaProxy(`after${i}`)).toBe(true);
    const before = proxy.accepts().filter((a) => a.listener === 'inbound').length;
    const r = await server.connect('198.18.23.1', 8080, 'in');
    expect(r.data).toBe('198.18.23.1:8080|in');
    await sleep(100);
    expect(proxy.accepts().filter((a) => a.listener === 'inbound').slice(before).map((a) => a.orig)).toEqual(['198.18.23.1:8080']);
  });

  it('a pod whose processes are nowhere on this node is reported as NOT repaired (Event, metric), never silently', async () => {
    const ghost = events.events.find((e) => e.pod === 'default/ghost');
    expect(ghost).toMatchObject({ type: 'Warning', reason: 'MeshcapUncaptured' });
    expect(ghost!.message).toMatch(/no process of pod UID .* on this node/);
    expect(await fx.agent.metrics.registry.getSingleMetricAsString('meshcap_repair_pods_total')).toContain('meshcap_repair_pods_total{action="repair",outcome="failed"} 1');
  });

  it('a second pass leaves the repaired pod alone (it has its record now) and does not retry the failed one within a minute (no Event per pod change); CHECK logic agrees with the kernel', async () => {
    const before = events.events.length;
    const out = await fx.agent.repair();
    expect(out).toEqual([]);
    expect(events.events.length).toBe(before);
    const r = await fx.agent.selfCheck();
    // ok pods are counted, not listed: the repaired pod is one of them
    expect(fx.agent.store.list().map((x) => `${x.podNamespace}/${x.podName}`)).toContain('default/late');
    expect(r).toMatchObject({ restored: 0, dropped: 0, failed: 0 });
    expect(r.ok).toBe(r.records);
    expect(r.pods).toEqual([]);
  });
});
