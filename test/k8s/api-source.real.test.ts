// ApiSource (the agent's pod list+watch) against a real kube-apiserver and
// etcd (built from their Go modules by scripts/build-k8s.sh), with real TLS,
// RBAC and a service-account token from the TokenRequest API, loaded the way
// the agent loads it in a pod (in-cluster config: token file + CA bundle, the
// token file re-read as kubelet rotates it). The agent reaches the API server
// through a TCP relay on 127.0.0.1 so a test can partition it alone.
//
// One control plane for the file; the tests run in order and each leaves the
// cluster as the next expects it:
//   happy path (ADDED/MODIFIED/DELETED, graceful deletion), podProblem Event,
//   (a) kube-apiserver killed and restarted, (b) 410 after an etcd compaction
//   (watch cache off), (b2) the same with the watch cache on and a restart,
//   (c) RBAC binding removed then restored, (d) token rotation and revocation.
import { mkdirSync, renameSync, writeFileSync, copyFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  CoreV1Api, KubeConfig, RbacAuthorizationV1Api, type V1Pod, type CoreV1Event,
} from '@kubernetes/client-node';
import { pino } from 'pino';
import { ApiSource, loadKubeConfig } from '../../src/kube/api-source.js';
import type { PodEventType } from '../../src/kube/pod-source.js';
import { ControlPlane, TcpRelay, controlPlaneBuilt } from '../helpers/k8s-control-plane.js';

const NODE = 'meshcap-node-1';
const NS = 'shop';
const AGENT_NS = 'meshcap-system';
const SA = 'meshcap';
const ROLE = 'meshcap-agent';
/** The API server's own minimum for TokenRequest expirationSeconds. */
const TOKEN_SECONDS = 600;
/** client-node's in-cluster token-file authenticator re-reads the file after 60 s. */
const TOKEN_REREAD_MS = 60_000;
/** Short server-side watch timeout: the source reconnects (and re-authenticates) every few seconds. */
const WATCH_TIMEOUT_S = 4;

if (!controlPlaneBuilt()) {
  // a failure, not a skip: CI must not pass without the real API server
  throw new Error('build/k8s/bin is missing kube-apiserver/etcd/etcdctl: run `npm run setup` (scripts/build-k8s.sh builds them)');
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** The source's recent log lines, for failure messages. */
let recentLogs: () => string = () => '';

async function until(cond: () => boolean | Promise<boolean>, what: string, timeoutMs = 20_000): Promise<number> {
  const t0 = Date.now();
  while (!(await cond())) {
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out after ${timeoutMs / 1000} s waiting for ${what}; the source's last log lines:\n${recentLogs()}`);
    await sleep(50);
  }
  return Date.now() - t0;
}

function pod(name: string, nodeName: string, labels: Record<string, string> = {}): V1Pod {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, namespace: NS, labels: { app: name, ...labels } },
    spec: {
      nodeName,
      containers: [{ name: 'app', image: 'registry.invalid/app:1' }],
      automountServiceAccountToken: false,
    },
  };
}

describe('ApiSource against a real kube-apiserver', () => {
  let cp: ControlPlane;
  let relay: TcpRelay;
  let core: CoreV1Api;
  let rbac: RbacAuthorizationV1Api;
  let src: ApiSource;
  let src2: ApiSource | undefined;
  let agentKc: KubeConfig;
  let saDir: string;
  const logs: { level: number; msg: string; err?: string; [k: string]: unknown }[] = [];
  const events: string[] = [];
  const timings: string[] = [];

  const names = () => src.list().map((p) => p.metadata!.name!).sort();
  const logsSince = (i: number) => logs.slice(i);
  const logText = (l: (typeof logs)[number]) => `${l.msg}${l.err ? `: ${l.err}` : ''}`;
  recentLogs = () => logs.slice(-12).map((l) => `  ${logText(l)}`).join('\n');

  /** A TokenRequest token for the agent's service account, bound to a fresh Secret (deleting it revokes the token). */
  async function issueToken(secretName: string): Promise<string> {
    const secret = await core.createNamespacedSecret({
      namespace: AGENT_NS,
      body: { metadata: { name: secretName }, type: 'Opaque', data: {} },
    });
    const tr = await core.createNamespacedServiceAccountToken({
      name: SA,
      namespace: AGENT_NS,
      body: {
        spec: {
          audiences: [],
          expirationSeconds: TOKEN_SECONDS,
          boundObjectRef: { apiVersion: 'v1', kind: 'Secret', name: secretName, uid: secret.metadata!.uid! },
        },
      },
    });
    const exp = new Date(tr.status!.expirationTimestamp!).getTime();
    expect(exp - Date.now()).toBeLessThanOrEqual(TOKEN_SECONDS * 1000 + 5000);
    return tr.status!.token!;
  }

  /** Replaces the projected token file atomically, as kubelet's atomic writer does. */
  function writeToken(token: string): void {
    const tmp = path.join(saDir, '.token.tmp');
    writeFileSync(tmp, token);
    renameSync(tmp, path.join(saDir, 'token'));
  }

  async function bindRole(): Promise<void> {
    await rbac.createClusterRoleBinding({
      body: {
        metadata: { name: ROLE },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: ROLE },
        subjects: [{ kind: 'ServiceAccount', name: SA, namespace: AGENT_NS }],
      },
    });
  }

  beforeAll(async () => {
    const t0 = Date.now();
    cp = await ControlPlane.start();
    timings.push(`control plane up in ${Date.now() - t0} ms (pki ${cp.startTimes.pki}, etcd ${cp.startTimes.etcd}, kube-apiserver ${cp.startTimes['kube-apiserver']})`);
    const admin = cp.adminKubeConfig();
    core = admin.makeApiClient(CoreV1Api);
    rbac = admin.makeApiClient(RbacAuthorizationV1Api);

    for (const ns of [NS, AGENT_NS]) await core.createNamespace({ body: { metadata: { name: ns } } });
    // no controller-manager: create the service accounts its controller would
    await core.createNamespacedServiceAccount({ namespace: NS, body: { metadata: { name: 'default' } } });
    await core.createNamespacedServiceAccount({ namespace: AGENT_NS, body: { metadata: { name: SA } } });
    // what deploy/ grants the agent
    await rbac.createClusterRole({
      body: {
        metadata: { name: ROLE },
        rules: [
          { apiGroups: [''], resources: ['pods'], verbs: ['get', 'list', 'watch'] },
          { apiGroups: [''], resources: ['events'], verbs: ['create', 'patch'] },
        ],
      },
    });
    await bindRole();

    // the pod's service-account volume: token, ca.crt, namespace
    const root = path.join(cp.dir, 'agent-root');
    saDir = path.join(root, 'var/run/secrets/kubernetes.io/serviceaccount');
    mkdirSync(saDir, { recursive: true });
    copyFileSync(cp.caFile, path.join(saDir, 'ca.crt'));
    writeFileSync(path.join(saDir, 'namespace'), AGENT_NS);
    writeToken(await issueToken('meshcap-token-1'));

    relay = new TcpRelay(cp.apiserverPort);
    await relay.start();
    // in-cluster config exactly as in a pod: KUBERNETES_SERVICE_HOST/PORT and
    // the files above (loadFromCluster's path prefix stands in for the mount)
    const saved = { h: process.env.KUBERNETES_SERVICE_HOST, p: process.env.KUBERNETES_SERVICE_PORT };
    process.env.KUBERNETES_SERVICE_HOST = '127.0.0.1';
    process.env.KUBERNETES_SERVICE_PORT = String(relay.port);
    agentKc = new KubeConfig();
    agentKc.loadFromCluster(root);
    if (saved.h === undefined) delete process.env.KUBERNETES_SERVICE_HOST; else process.env.KUBERNETES_SERVICE_HOST = saved.h;
    if (saved.p === undefined) delete process.env.KUBERNETES_SERVICE_PORT; else process.env.KUBERNETES_SERVICE_PORT = saved.p;

    await core.createNamespacedPod({ namespace: NS, body: pod('web-1', NODE) });
    await core.createNamespacedPod({ namespace: NS, body: pod('elsewhere-1', 'other-node') });

    const logger = pino({ level: 'debug' }, {
      write(line: string) {
        logs.push(JSON.parse(line) as (typeof logs)[number]);
      },
    });
    src = new ApiSource({
      kubeConfig: agentKc, nodeName: NODE, logger, minBackoffMs: 100, maxBackoffMs: 1000, watchTimeoutSeconds: WATCH_TIMEOUT_S,
    });
    src.on('change', (type: PodEventType, p: V1Pod) => events.push(`${type} ${p.metadata!.name}`));
  }, 180_000);

  afterAll(async () => {
    await src?.stop();
    await src2?.stop();
    await relay?.stop();
    await cp?.stop();
    if (timings.length) console.log(`k8s api-source timings:\n  ${timings.join('\n  ')}`);
  }, 60_000);

  it('lists and watches this node\'s pods with a service-account token: ADDED, MODIFIED, graceful and immediate DELETED', async () => {
    const t0 = Date.now();
    // the agent is the service account, not an admin: in-cluster token file,
    // and RBAC holds it to its ClusterRole
    expect(agentKc.getCurrentUser()?.authProvider?.name).toBe('tokenFile');
    await expect(agentKc.makeApiClient(CoreV1Api).listNamespacedSecret({ namespace: AGENT_NS })).rejects.toMatchObject({ code: 403 });
    await src.start();
    expect(src.synced()).toBe(true);
    expect(names()).toEqual(['web-1']);
    // this API server (WatchList on, Kubernetes 1.34+) streams the initial pods on the watch
    expect(logs.find((l) => l.msg === 'pods of this node listed')).toMatchObject({ how: 'watch-list', pods: 1 });
    await until(() => src.status().watching, 'the watch');

    await core.createNamespacedPod({ namespace: NS, body: pod('web-2', NODE) });
    await core.createNamespacedPod({ namespace: NS, body: pod('elsewhere-2', 'other-node') });
    await until(() => names().includes('web-2'), 'web-2 ADDED');

    const cur = await core.readNamespacedPod({ namespace: NS, name: 'web-2' });
    cur.metadata!.labels = { ...cur.metadata!.labels, version: 'v2' };
    await core.replaceNamespacedPod({ namespace: NS, name: 'web-2', body: cur });
    await until(() => src.get(NS, 'web-2')?.metadata?.labels?.version === 'v2', 'web-2 MODIFIED');

    // a bound pod is deleted gracefully: deletionTimestamp set (MODIFIED), the
    // object stays until the kubelet (none here) confirms; force it with grace 0
    await core.deleteNamespacedPod({ namespace: NS, name: 'web-2' });
    await until(() => !!src.get(NS, 'web-2')?.metadata?.deletionTimestamp, 'web-2 deletionTimestamp');
    expect(names()).toContain('web-2');
    await core.deleteNamespacedPod({ namespace: NS, name: 'web-2', gracePeriodSeconds: 0 });
    await until(() => !names().includes('web-2'), 'web-2 DELETED');

    // label change, deletionTimestamp, then the forced delete's last MODIFIED
    // (grace period 0) and DELETED
    expect(events.slice(0, 4)).toEqual(['ADDED web-1', 'ADDED web-2', 'MODIFIED web-2', 'MODIFIED web-2']);
    expect(events.slice(4, -1).every((e) => e === 'MODIFIED web-2')).toBe(true);
    expect(events.at(-1)).toBe('DELETED web-2');
    expect(names()).toEqual(['web-1']);
    expect(src.status().lastError).toBeUndefined();
    timings.push(`happy path ${Date.now() - t0} ms`);
  }, 60_000);

  it('podProblem posts a Warning Event on the pod (events create through RBAC)', async () => {
    await src.podProblem(NS, 'web-1', 'MeshcapRedirectLost', 'test: redirect lost');
    const uid = src.get(NS, 'web-1')!.metadata!.uid;
    const list = await core.listNamespacedEvent({ namespace: NS, fieldSelector: 'involvedObject.name=web-1' });
    const ev = list.items.find((e: CoreV1Event) => e.reason === 'MeshcapRedirectLost');
    expect(ev).toBeDefined();
    expect(ev).toMatchObject({
      type: 'Warning',
      message: 'test: redirect lost',
      involvedObject: { kind: 'Pod', namespace: NS, name: 'web-1', uid },
      source: { component: 'meshcap-agent', host: NODE },
    });
  }, 30_000);

  it('(a) kube-apiserver killed and restarted: the watch resumes and sees changes made after the restart', async () => {
    const t0 = Date.now();
    const mark = logs.length;
    await cp.stopApiserver('SIGKILL');
    await until(() => !!src.status().lastError, 'a failed list/watch while the API server is down', 30_000);
    // no fail-open: still synced, the last state kept
    expect(src.synced()).toBe(true);
    expect(names()).toEqual(['web-1']);

    await cp.startApiserver();
    const restarted = Date.now();
    await core.createNamespacedPod({ namespace: NS, body: pod('web-3', NODE) });
    await until(() => names().includes('web-3'), 'web-3 ADDED after the restart', 30_000);
    await core.deleteNamespacedPod({ namespace: NS, name: 'web-1', gracePeriodSeconds: 0 });
    await until(() => !names().includes('web-1'), 'web-1 DELETED after the restart', 30_000);
    expect(names()).toEqual(['web-3']);
    const resumed = logsSince(mark).map(logText);
    expect(resumed.some((m) => m.startsWith('pod list/watch failed; retrying'))).toBe(true);
    expect(resumed.some((m) => m.startsWith('pod watch re-established') || m.includes('relisting'))).toBe(true);
    timings.push(`(a) restart: kube-apiserver ready again in ${cp.startTimes['kube-apiserver']} ms, changes seen ${Date.now() - restarted} ms after; ${Date.now() - t0} ms in all`);
  }, 180_000);

  it('(b) a 410 after etcd is compacted past the watch\'s resourceVersion: the source relists and is correct', async () => {
    const t0 = Date.now();
    // The watch cache would serve the stale resourceVersion from memory (its
    // window is not cut by an etcd compaction), so for this test the API
    // server runs without it: watches and lists go to etcd, as they do for a
    // resource whose cache is disabled or not yet initialised.
    await cp.stopApiserver('SIGTERM');
    await cp.startApiserver(['--watch-cache=false']);
    await until(() => src.status().watching && src.status().lastError === undefined, 'the watch on the cacheless API server', 30_000);
    const mark = logs.length;
    const staleRv = Number(src.status().resourceVersion);
    // partition the agent alone, change its pods behind its back, compact
    relay.cut();
    await until(() => !src.status().watching, 'the watch to drop');
    await core.deleteNamespacedPod({ namespace: NS, name: 'web-3', gracePeriodSeconds: 0 });
    await core.createNamespacedPod({ namespace: NS, body: pod('web-4', NODE) });
    for (let i = 0; i < 5; i++) await core.createNamespacedPod({ namespace: NS, body: pod(`filler-${i}`, 'other-node') });
    const compacted = cp.compactEtcd();
    expect(compacted).toBeGreaterThan(staleRv);
    relay.heal();

    await until(() => logsSince(mark).some((l) => /410/.test(logText(l))), 'a 410 Gone from the API server', 60_000);
    await until(() => names().join() === 'web-4', 'the relisted state (web-3 gone, web-4 there)', 30_000);
    expect(Number(src.status().resourceVersion)).toBeGreaterThanOrEqual(compacted);
    // and the watch after the relist is live
    await core.createNamespacedPod({ namespace: NS, body: pod('web-5', NODE) });
    await until(() => names().includes('web-5'), 'web-5 after the relist');
    expect(src.synced()).toBe(true);
    timings.push(`(b) 410: "${logsSince(mark).filter((l) => /410/.test(logText(l))).map(logText)[0]}"; ${Date.now() - t0} ms with two kube-apiserver restarts`);
    // back to the default configuration (watch cache on) for the next tests
    await cp.stopApiserver('SIGTERM');
    await cp.startApiserver();
    await until(() => src.status().watching && src.status().lastError === undefined, 'the watch on the restarted API server', 30_000);
  }, 120_000);

  it('(b2) the same with the watch cache on (the default): changes behind a partition, compaction and an API server restart give a 410, the source relists', async () => {
    const t0 = Date.now();
    await until(() => src.status().watching, 'the watch');
    const mark = logs.length;
    relay.cut();
    await until(() => !src.status().watching, 'the watch to drop');
    await core.deleteNamespacedPod({ namespace: NS, name: 'web-5', gracePeriodSeconds: 0 });
    await core.createNamespacedPod({ namespace: NS, body: pod('web-5b', NODE) });
    for (let i = 5; i < 10; i++) await core.createNamespacedPod({ namespace: NS, body: pod(`filler-${i}`, 'other-node') });
    cp.compactEtcd();
    // a fresh watch cache starts at etcd's current revision: it has no history
    // for the source's resourceVersion (and etcd has compacted it away)
    await cp.stopApiserver('SIGKILL');
    await cp.startApiserver();
    relay.heal();
    await until(() => logsSince(mark).some((l) => /410/.test(logText(l))), 'a 410 Gone from the restarted API server', 60_000);
    await until(() => names().join() === 'web-4,web-5b', 'the relisted state (web-5 gone, web-5b there)', 30_000);
    // put back what the next tests expect, through the live watch
    await core.deleteNamespacedPod({ namespace: NS, name: 'web-5b', gracePeriodSeconds: 0 });
    await core.createNamespacedPod({ namespace: NS, body: pod('web-5', NODE) });
    await until(() => names().join() === 'web-4,web-5', 'web-5b DELETED and web-5 ADDED after the relist');
    expect(src.synced()).toBe(true);
    timings.push(`(b2) 410 with the watch cache: "${logsSince(mark).filter((l) => /410/.test(logText(l))).map(logText)[0]}"; ${Date.now() - t0} ms with one restart`);
  }, 120_000);

  it('(c) RBAC binding removed: a log line names the missing permission, the last state is kept; restored: synced again', async () => {
    const t0 = Date.now();
    const mark = logs.length;
    await rbac.deleteClusterRoleBinding({ name: ROLE });
    const forbidden = () => logsSince(mark).filter((l) => /forbidden|403/i.test(logText(l)));
    await until(() => forbidden().length > 0, 'a 403 on the next list/watch', (WATCH_TIMEOUT_S + 30) * 1000);
    const line = logText(forbidden()[0]!);
    expect(line).toMatch(/pods/);
    expect(line).toMatch(/watch|list/);
    // no fail-open: synced, the last state, never "no pods"
    await core.createNamespacedPod({ namespace: NS, body: pod('web-6', NODE) });
    await sleep(3000);
    expect(src.synced()).toBe(true);
    expect(names()).toEqual(['web-4', 'web-5']);
    expect(src.status().lastError).toMatch(/403/);

    await bindRole();
    await until(() => names().includes('web-6'), 'web-6 once the binding is back', 60_000);
    expect(names()).toEqual(['web-4', 'web-5', 'web-6']);
    await until(() => src.status().watching && src.status().lastError === undefined, 'a healthy watch');
    timings.push(`(c) RBAC: "${line}"; synced again ${Date.now() - t0} ms after the binding was removed`);
  }, 120_000);

  it('(d) token rotation: the file is replaced before expiry, the old token revoked, the watch continues; a revoked current token is a clear 401, state kept', async () => {
    const t0 = Date.now();
    // beside the in-cluster source, one started the `meshcap agent
    // --kubeconfig FILE` way, whose user has a token file (the same file)
    const kubeconfigFile = path.join(cp.dir, 'agent.kubeconfig');
    writeFileSync(kubeconfigFile, [
      'apiVersion: v1', 'kind: Config', 'current-context: agent',
      'clusters:', `- name: test`, `  cluster: {server: "https://127.0.0.1:${relay.port}", certificate-authority: "${path.join(saDir, 'ca.crt')}"}`,
      'users:', `- name: agent`, `  user: {tokenFile: "${path.join(saDir, 'token')}"}`,
      'contexts:', '- name: agent', '  context: {cluster: test, user: agent}', '',
    ].join('\n'));
    const logs2: string[] = [];
    // (its LIST in pages of 2: the three pods take two pages and a continue token)
    src2 = new ApiSource({
      kubeConfig: loadKubeConfig(kubeconfigFile), nodeName: NODE, minBackoffMs: 100, maxBackoffMs: 1000, watchTimeoutSeconds: WATCH_TIMEOUT_S, listPageSize: 2,
      logger: pino({ level: 'debug' }, { write(line: string) { const l = JSON.parse(line) as { msg: string; err?: string }; logs2.push(`${l.msg}${l.err ? `: ${l.err}` : ''}`); } }),
    });
    await src2.start();
    const names2 = () => src2!.list().map((p) => p.metadata!.name!).sort();
    expect(names2()).toEqual(names());

    writeToken(await issueToken('meshcap-token-2'));
    // the authenticator re-reads the file after TOKEN_REREAD_MS; meanwhile
    // the source keeps working on the old token
    await core.createNamespacedPod({ namespace: NS, body: pod('web-7', NODE) });
    await until(() => names().includes('web-7'), 'web-7');
    await sleep(TOKEN_REREAD_MS + WATCH_TIMEOUT_S * 1000 + 2000);
    // revoke the first token: only the rotated one can work from now on
    const mark = logs.length;
    const revoked1 = Date.now();
    await core.deleteNamespacedSecret({ namespace: AGENT_NS, name: 'meshcap-token-1' });
    // several watch reconnects, each authenticated afresh
    await sleep(4 * WATCH_TIMEOUT_S * 1000);
    await core.createNamespacedPod({ namespace: NS, body: pod('web-8', NODE) });
    await until(() => names().includes('web-8'), 'web-8 with the rotated token');
    const quietAfterRevoke1 = Date.now() - revoked1;
    expect(logsSince(mark).filter((l) => /401|rejected/.test(logText(l))).map(logText)).toEqual([]);
    // the kubeconfig source re-read its token file too
    await until(() => names2().includes('web-8'), 'web-8 in the kubeconfig source');
    expect(logs2.filter((l) => /401|rejected/.test(l))).toEqual([]);
    const mark2b = logs2.length;

    // negative control: revoking the token in the file does stop the source,
    // and sooner than the quiet period above (so that period proves the old
    // token was no longer in use, not that revocation is slow)
    const mark2 = logs.length;
    const revoked2 = Date.now();
    await core.deleteNamespacedSecret({ namespace: AGENT_NS, name: 'meshcap-token-2' });
    await until(() => logsSince(mark2).some((l) => /401/.test(logText(l))), 'a 401 once the current token is revoked', 60_000);
    const rejectedAfter = Date.now() - revoked2;
    expect(rejectedAfter).toBeLessThan(quietAfterRevoke1);
    const line = logText(logsSince(mark2).find((l) => /401/.test(logText(l)))!);
    expect(line).toMatch(/credentials were rejected/);
    // no fail-open: synced, the last state kept
    expect(src.synced()).toBe(true);
    expect(names()).toEqual(['web-4', 'web-5', 'web-6', 'web-7', 'web-8']);
    await until(() => logs2.slice(mark2b).some((l) => /401/.test(l)), 'a 401 in the kubeconfig source too', 60_000);
    expect(names2()).toEqual(names());
    timings.push(`(d) token rotation ${Date.now() - t0} ms (includes the ${TOKEN_REREAD_MS / 1000} s token-file re-read interval); ` +
      `old token revoked: no 401 in ${quietAfterRevoke1} ms; current token revoked: "${line}" after ${rejectedAfter} ms`);
  }, 180_000);
});

describe('ApiSource against a real kube-apiserver with the WatchList gate off (1.33\'s default)', () => {
  it('is refused the watch-list (422), lists instead, then watches from the list\'s version', async () => {
    const cp = await ControlPlane.start({ apiserverArgs: ['--feature-gates=WatchList=false'] });
    const lines: { msg: string; how?: string; reason?: string }[] = [];
    const logger = pino({ level: 'info' }, { write: (l: string) => lines.push(JSON.parse(l) as (typeof lines)[number]) });
    let src: ApiSource | undefined;
    try {
      const core = cp.adminKubeConfig().makeApiClient(CoreV1Api);
      await cp.createNamespace(NS);
      for (const n of ['web-1', 'web-2']) await core.createNamespacedPod({ namespace: NS, body: pod(n, NODE) });
      src = new ApiSource({ kubeConfig: cp.adminKubeConfig(), nodeName: NODE, logger, minBackoffMs: 50 });
      await src.start();
      expect(src.list().map((p) => p.metadata!.name).sort()).toEqual(['web-1', 'web-2']);
      expect(lines.find((l) => l.msg.startsWith('the API server does not stream'))?.reason).toMatch(/^HTTP 422/);
      expect(lines.find((l) => l.msg === 'pods of this node listed')?.how).toBe('list');
      await until(() => src!.status().watching, 'the watch');
      await core.createNamespacedPod({ namespace: NS, body: pod('web-3', NODE) });
      await until(() => src!.list().some((p) => p.metadata!.name === 'web-3'), 'web-3 on the watch');
      expect(src.status().lastError).toBeUndefined();
    } finally {
      await src?.stop();
      await cp.stop();
    }
  }, 120_000);
});
