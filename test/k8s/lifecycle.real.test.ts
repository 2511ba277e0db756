// The cluster calls of issue 13 against a real kube-apiserver:
//   install-cni's SIGTERM verdict (owner.ts), and runInstallCni end to end: its DaemonSet present (rollout,
//   drain: keep the CNI entry), being deleted with foreground propagation
//   (deletionTimestamp), gone (background delete), unreadable (no RBAC: keep);
//   repair's actions through ApiSource: a Warning Event, the uncaptured label,
//   a delete with the pod's UID as precondition; the optional node taint removed.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AppsV1Api, CoreV1Api, KubeConfig, RbacAuthorizationV1Api, type V1DaemonSet, type V1Role, type V1RoleBinding } from '@kubernetes/client-node';
import { pino } from 'pino';
import { ApiSource } from '../../src/kube/api-source.js';
import { daemonSetVerdict, DaemonSetWatch, terminationVerdict } from '../../src/install-cni/owner.js';
import { render } from '../helpers/chart.js';
import { runInstallCni } from '../../src/install-cni/run.js';
import { TaintRemover } from '../../src/install-cni/taint.js';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { ControlPlane, controlPlaneBuilt } from '../helpers/k8s-control-plane.js';

if (!controlPlaneBuilt()) throw new Error('build/k8s/bin is missing kube-apiserver/etcd/etcdctl: run `npm run setup` (scripts/build-k8s.sh builds them)');

const NS = 'meshcap-system';
let cp: ControlPlane;
let kc: KubeConfig;
let apps: AppsV1Api;
let core: CoreV1Api;

const ds = (name: string): V1DaemonSet => ({
  metadata: { name, namespace: NS },
  spec: {
    selector: { matchLabels: { app: name } },
    template: { metadata: { labels: { app: name } }, spec: { containers: [{ name: 'c', image: 'registry.invalid/x:1' }] } },
  },
});

beforeAll(async () => {
  cp = await ControlPlane.start();
  kc = cp.adminKubeConfig();
  apps = kc.makeApiClient(AppsV1Api);
  core = kc.makeApiClient(CoreV1Api);
  await core.createNamespace({ body: { metadata: { name: NS } } });
  await core.createNamespace({ body: { metadata: { name: 'shop' } } });
  // no controller-manager here: the pod admission wants the namespace's default service account
  await core.createNamespacedServiceAccount({ namespace: 'shop', body: { metadata: { name: 'default' } } });
});
afterAll(async () => {
  await cp?.stop();
});

describe('install-cni on SIGTERM: remove the CNI entry only when the DaemonSet goes', () => {
  it('keeps it while the DaemonSet exists (a rollout, a drain, a restart)', async () => {
    await apps.createNamespacedDaemonSet({ namespace: NS, body: ds('meshcap') });
    const v = await daemonSetVerdict(kc, NS, 'meshcap');
    expect(v).toMatchObject({ remove: false });
    expect(v.why).toMatch(/still exists/);
  });
  it('removes it while the DaemonSet is being deleted (foreground: deletionTimestamp, the GC has not finished)', async () => {
    await apps.deleteNamespacedDaemonSet({ namespace: NS, name: 'meshcap', body: { propagationPolicy: 'Foreground' } });
    // no garbage collector runs in this control plane: the object stays with its finalizer
    const obj = await apps.readNamespacedDaemonSet({ namespace: NS, name: 'meshcap' });
    expect(obj.metadata?.deletionTimestamp).toBeDefined();
    const v = await daemonSetVerdict(kc, NS, 'meshcap');
    expect(v).toMatchObject({ remove: true });
    expect(v.why).toMatch(/being deleted/);
  });
  it('removes it when the DaemonSet is gone (kubectl delete, helm uninstall)', async () => {
    const v = await daemonSetVerdict(kc, NS, 'never-existed');
    expect(v).toMatchObject({ remove: true });
    expect(v.why).toMatch(/no longer exists/);
  });
  it('keeps it when the API server cannot answer (unreachable): a stale entry fails loudly, a wrong removal would not', async () => {
    const off = new KubeConfig();
    off.loadFromOptions({
      clusters: [{ name: 'x', server: 'https://127.0.0.1:1', skipTLSVerify: true }],
      users: [{ name: 'u', token: 't' }], contexts: [{ name: 'x', cluster: 'x', user: 'u' }], currentContext: 'x',
    });
    const v = await daemonSetVerdict(off, NS, 'meshcap', 3000);
    expect(v).toMatchObject({ remove: false });
    expect(v.why).toMatch(/cannot read DaemonSet/);
  });
});

describe('a whole-release delete: the Role goes too, the open watch still tells', () => {
  it('with the chart\'s own Role, the watch sees the DaemonSet deleted after its RoleBinding was; a GET at SIGTERM would get 403', async () => {
    const rbac = kc.makeApiClient(RbacAuthorizationV1Api);
    const objs = render([]);
    await rbac.createNamespacedRole({ namespace: NS, body: objs.find((o) => o.kind === 'Role') as V1Role });
    await rbac.createNamespacedRoleBinding({ namespace: NS, body: objs.find((o) => o.kind === 'RoleBinding') as V1RoleBinding });
    await apps.createNamespacedDaemonSet({ namespace: NS, body: ds('meshcap') }).catch(async () => {
      // left by the foreground test above: finish that delete first
      await apps.patchNamespacedDaemonSet({ namespace: NS, name: 'meshcap', body: [{ op: 'remove', path: '/metadata/finalizers' }] });
      await new Promise((r) => setTimeout(r, 200));
      await apps.createNamespacedDaemonSet({ namespace: NS, body: ds('meshcap') });
    });
    // install-cni's identity: the chart's service account (x509 CN = its user name)
    const sa = new KubeConfig();
    sa.loadFromFile(cp.issueClient('meshcap-sa', { cn: `system:serviceaccount:${NS}:meshcap`, o: 'system:serviceaccounts' }));
    const log = pino({ level: 'silent' });
    const watch = new DaemonSetWatch(sa, NS, 'meshcap', log);
    const state = () => watch.state; // read afresh each time (the watch changes it)
    await watch.start();
    try {
      for (let i = 0; state() !== 'present'; i++) {
        if (i > 100) throw new Error(`watch state ${state()}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      expect(await daemonSetVerdict(sa, NS, 'meshcap')).toMatchObject({ remove: false });
      // the release goes in the worst order: RBAC first, then the DaemonSet
      await rbac.deleteNamespacedRoleBinding({ namespace: NS, name: 'meshcap' });
      await rbac.deleteNamespacedRole({ namespace: NS, name: 'meshcap' });
      await apps.deleteNamespacedDaemonSet({ namespace: NS, name: 'meshcap' });
      for (let i = 0; state() !== 'deleted'; i++) {
        if (i > 100) throw new Error(`watch state ${state()}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      const get = await daemonSetVerdict(sa, NS, 'meshcap');
      expect(get).toMatchObject({ remove: false });
      expect(get.why).toMatch(/HTTP 403/);
      const v = await terminationVerdict(sa, NS, 'meshcap', watch);
      expect(v).toMatchObject({ remove: true });
      expect(v.why).toMatch(/seen by the watch/);
    } finally {
      watch.stop();
    }
  });
});

describe('runInstallCni end to end: installs, then on the stop signal asks about its DaemonSet', () => {
  const conflist = JSON.stringify({ cniVersion: '1.0.0', name: 'k8s', plugins: [{ type: 'bridge' }] }, null, 2);
  const entry = { type: 'meshcap-cni' as const, agentSocket: '/var/run/meshcap/cni.sock' };
  function dirs() {
    const d = mkdtempSync(path.join(tmpdir(), 'meshcap-lifecycle-'));
    mkdirSync(path.join(d, 'net.d'));
    mkdirSync(path.join(d, 'bin'));
    writeFileSync(path.join(d, 'net.d', '10-k8s.conflist'), conflist);
    writeFileSync(path.join(d, 'src'), 'not really an executable');
    return d;
  }
  async function runUntilStopped(d: string, name: string, beforeStop: () => Promise<void>) {
    let stop!: (s: string) => void;
    const signal = new Promise<string>((r) => (stop = r));
    const done = runInstallCni({
      confDir: path.join(d, 'net.d'), binDirs: [path.join(d, 'bin')], entry, source: path.join(d, 'src'),
      logger: pino({ level: 'silent' }), daemonSet: { namespace: NS, name, kubeConfig: () => kc },
    }, signal);
    for (let i = 0; !readFileSync(path.join(d, 'net.d', '10-k8s.conflist'), 'utf8').includes('meshcap-cni'); i++) {
      if (i > 100) throw new Error('never installed');
      await new Promise((r) => setTimeout(r, 20));
    }
    await new Promise((r) => setTimeout(r, 300)); // the DaemonSet watch is up
    await beforeStop();
    stop('SIGTERM');
    return done;
  }

  it('a rollout (the DaemonSet stays): entry and binary stay', async () => {
    const d = dirs();
    try {
      await apps.createNamespacedDaemonSet({ namespace: NS, body: ds('meshcap-roll') });
      const r = await runUntilStopped(d, 'meshcap-roll', async () => undefined);
      expect(r.removed).toBe(false);
      expect(readFileSync(path.join(d, 'net.d', '10-k8s.conflist'), 'utf8')).toContain('meshcap-cni');
      expect(existsSync(path.join(d, 'bin', 'meshcap-cni'))).toBe(true);
    } finally {
      rmSync(d, { recursive: true, force: true });
    }
  });

  it('an uninstall (the DaemonSet deleted before the pod stops): the file is the primary CNI\'s again, the binary gone', async () => {
    const d = dirs();
    try {
      await apps.createNamespacedDaemonSet({ namespace: NS, body: ds('meshcap-gone') });
      const r = await runUntilStopped(d, 'meshcap-gone', async () => {
        await apps.deleteNamespacedDaemonSet({ namespace: NS, name: 'meshcap-gone' });
        await new Promise((res) => setTimeout(res, 300));
      });
      expect(r).toMatchObject({ removed: true });
      expect(r.verdict.why).toMatch(/seen by the watch/);
      expect(readFileSync(path.join(d, 'net.d', '10-k8s.conflist'), 'utf8')).toBe(conflist);
      expect(existsSync(path.join(d, 'bin', 'meshcap-cni'))).toBe(false);
    } finally {
      rmSync(d, { recursive: true, force: true });
    }
  });
});

describe('the optional node taint', () => {
  it('is removed once both halves are ready, not before, and only that taint', async () => {
    const node = 'node-tainted';
    await core.createNode({ body: { metadata: { name: node }, spec: { taints: [
      { key: 'other', effect: 'NoSchedule' },
      { key: 'meshcap.io/not-ready', effect: 'NoSchedule' },
    ] } } });
    let ready = false;
    const remover = new TaintRemover({ kubeConfig: kc, nodeName: node, key: 'meshcap.io/not-ready', ready: async () => ready, logger: pino({ level: 'silent' }) });
    // the API server adds node.kubernetes.io/not-ready itself (TaintNodesByCondition)
    const keys = async () => (await core.readNode({ name: node })).spec?.taints?.map((t) => t.key) ?? [];
    const before = await keys();
    expect(before).toEqual(expect.arrayContaining(['other', 'meshcap.io/not-ready']));
    expect(await remover.pass()).toBe(false);
    expect(await keys()).toEqual(before);
    ready = true;
    expect(await remover.pass()).toBe(true);
    expect(await keys()).toEqual(before.filter((k) => k !== 'meshcap.io/not-ready'));
    expect(await remover.pass()).toBe(true); // nothing left to do
  });
});

describe('repair actions through ApiSource', () => {
  let src: ApiSource;
  beforeAll(async () => {
    src = new ApiSource({ kubeConfig: kc, nodeName: 'node-1', logger: pino({ level: 'silent' }) });
    await src.start();
  });
  afterAll(async () => {
    await src?.stop();
  });

  it('posts a Warning Event, labels the pod, and deletes it only while it is the same pod (UID precondition)', async () => {
    const pod = await core.createNamespacedPod({ namespace: 'shop', body: { metadata: { name: 'late' }, spec: { nodeName: 'node-1', automountServiceAccountToken: false, containers: [{ name: 'app', image: 'registry.invalid/app:1' }] } } });
    await src.podEvent('shop', 'late', 'Warning', 'MeshcapRepaired', 'pod shop/late was running without meshcap capture');
    const events = await core.listNamespacedEvent({ namespace: 'shop' });
    expect(events.items.map((e) => [e.reason, e.type, e.involvedObject.name])).toContainEqual(['MeshcapRepaired', 'Warning', 'late']);
    await src.labelPod('shop', 'late', { 'meshcap.io/uncaptured': 'true' });
    expect((await core.readNamespacedPod({ namespace: 'shop', name: 'late' })).metadata?.labels).toMatchObject({ 'meshcap.io/uncaptured': 'true' });
    await expect(src.deletePod('shop', 'late', 'another-uid')).rejects.toMatchObject({ code: 409 });
    await src.deletePod('shop', 'late', pod.metadata!.uid);
    const after = await core.readNamespacedPod({ namespace: 'shop', name: 'late' }).catch((e: { code?: number }) => e.code);
    // deleted, or terminating (no kubelet confirms it here)
    expect(after === 404 || (typeof after === 'object' && after.metadata?.deletionTimestamp !== undefined)).toBe(true);
  });
});
