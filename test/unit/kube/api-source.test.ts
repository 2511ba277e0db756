// ApiSource driven through @kubernetes/client-node against the in-process API
// server on 127.0.0.1: real HTTP, real list/watch protocol.
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { KubeConfig, type V1Pod } from '@kubernetes/client-node';
import { pino } from 'pino';
import { ApiSource } from '../../../src/kube/api-source.js';
import { kubeRequest } from '../../../src/kube/rest.js';
import type { PodEventType } from '../../../src/kube/pod-source.js';
import { KubeApiServer, testPod } from '../../helpers/kube-apiserver.js';

const NODE = 'node-a';
const quiet = pino({ level: 'silent' });

function kubeConfig(server: string): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'test', server, skipTLSVerify: true }],
    users: [{ name: 'test' }],
    contexts: [{ name: 'test', cluster: 'test', user: 'test' }],
    currentContext: 'test',
  });
  return kc;
}

async function until(cond: () => boolean, what: string, timeoutMs = 3000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

// 'stream': a server with watch-list (Kubernetes 1.34+): the initial pods come
// on the watch itself. 'refuse': one that answers it 422 (1.30-1.33, the gate
// off): the source lists, then watches from the list's version.
describe.each(['stream', 'refuse'] as const)('ApiSource, watch-list %s', (watchList) => {
  let api: KubeApiServer;
  let src: ApiSource | undefined;
  let events: string[];

  const open = (opts: Partial<ConstructorParameters<typeof ApiSource>[0]> = {}) => {
    src = new ApiSource({ kubeConfig: kubeConfig(api.url), nodeName: NODE, logger: quiet, minBackoffMs: 20, maxBackoffMs: 200, ...opts });
    src.on('change', (type: PodEventType, pod: V1Pod) => events.push(`${type} ${pod.metadata!.namespace}/${pod.metadata!.name}`));
    return src;
  };
  const names = () => src!.list().map((p) => `${p.metadata!.namespace}/${p.metadata!.name}`).sort();
  const lists = () => api.requests.filter((r) => r.query.watch === undefined && r.method === 'GET');
  const watchLists = () => api.requests.filter((r) => r.query.watch === 'true' && r.query.sendInitialEvents === 'true');
  /** the full syncs: watch-lists, or LISTs where the server refuses them */
  const syncs = () => (watchList === 'stream' ? watchLists() : lists());
  /**
   * A second full sync made and adopted, its watch open. The server (in this
   * process) writes a watch-list's pods and end bookmark in the same turn it
   * counts the watch, so an open watch alone does not say the client has read
   * them: it adopts them, and takes the bookmark's version, at the bookmark.
   */
  const relisted = (s: ApiSource) => syncs().length === 2 && api.watchCount === 1 && s.status().resourceVersion === api.resourceVersion;
  /** watches that resume from a version */
  const watches = () => api.requests.filter((r) => r.query.watch === 'true' && r.query.sendInitialEvents === undefined);

  beforeEach(async () => {
    events = [];
    api = await KubeApiServer.start({ watchList });
    api.addPod(testPod('shop', 'web-1', NODE));
    api.addPod(testPod('shop', 'web-2', 'node-b'));
    api.addPod(testPod('default', 'db-0', NODE));
  });
  afterEach(async () => {
    await src?.stop();
    src = undefined;
    await api.stop();
  });

  it('lists only this node\'s pods, then watches from the list\'s version with bookmarks', async () => {
    const s = open();
    expect(s.synced()).toBe(false);
    await s.start();
    expect(s.synced()).toBe(true);
    expect(names()).toEqual(['default/db-0', 'shop/web-1']);
    expect(events.sort()).toEqual(['ADDED default/db-0', 'ADDED shop/web-1']);
    await until(() => s.status().watching, 'the watch');
    // the first request is a watch-list either way: it asks for a consistent read, streamed
    expect(api.requests[0]!.query).toMatchObject({ fieldSelector: 'spec.nodeName=node-a', watch: 'true', sendInitialEvents: 'true', resourceVersionMatch: 'NotOlderThan', allowWatchBookmarks: 'true' });
    expect(api.requests[0]!.query.resourceVersion).toBeUndefined();
    if (watchList === 'stream') {
      // one request: the initial pods, then the changes, on the same stream
      expect(api.requests).toHaveLength(1);
      expect(s.status().resourceVersion).toBe(api.resourceVersion);
    } else {
      expect(watchLists()).toHaveLength(1);
      expect(lists()[0]!.query).toMatchObject({ fieldSelector: 'spec.nodeName=node-a', resourceVersion: '0' });
      expect(watches()[0]!.query).toMatchObject({
        fieldSelector: 'spec.nodeName=node-a',
        allowWatchBookmarks: 'true',
        resourceVersion: api.resourceVersion,
      });
    }
  });

  it('keeps each pod\'s compact view; a LIST goes in pages (limit, then continue without a resourceVersion)', async () => {
    api.addPod(testPod('shop', 'web-3', NODE, { metadata: { name: 'web-3', namespace: 'shop', annotations: { 'sidecar.istio.io/status': '{}', 'kubectl.kubernetes.io/last-applied-configuration': 'x'.repeat(1000) } } }));
    const s = open({ listPageSize: 1 });
    await s.start();
    expect(names()).toEqual(['default/db-0', 'shop/web-1', 'shop/web-3']);
    expect(s.get('shop', 'web-3')!.metadata!.annotations).toEqual({ 'sidecar.istio.io/status': '{}' });
    expect(s.get('shop', 'web-3')!.metadata!.uid).toBeTruthy();
    if (watchList === 'stream') {
      expect(lists()).toEqual([]);
      return;
    }
    expect(lists().map((r) => [r.query.limit, r.query.resourceVersion, r.query.continue === undefined ? 'first' : 'continue'])).toEqual([
      ['1', '0', 'first'], ['1', undefined, 'continue'], ['1', undefined, 'continue'],
    ]);
    // the watch starts from the list's version, not a later page's
    await until(() => s.status().watching, 'the watch');
    expect(watches()[0]!.query.resourceVersion).toBe(api.resourceVersion);
  });

  it('applies watch events, ignores other nodes, sees a pod bound to this node, and waitFor gets a late pod', async () => {
    const s = open();
    await s.start();
    events = [];
    const late = s.waitFor('shop', 'late', 3000);
    api.addPod(testPod('shop', 'late', NODE));
    expect((await late)?.spec?.nodeName).toBe(NODE);

    api.modifyPod('shop', 'web-1', (p) => { p.metadata!.labels = { v: '2' }; });
    api.deletePod('default', 'db-0');
    api.addPod(testPod('shop', 'elsewhere', 'node-b'));
    api.addPod(testPod('shop', 'pending', ''));
    api.modifyPod('shop', 'pending', (p) => { p.spec!.nodeName = NODE; }); // the scheduler binds it here
    await until(() => events.length === 4, '4 events');
    // No event for the pod on node-b, nor for "pending" until it was bound here.
    expect(events).toEqual(['ADDED shop/late', 'MODIFIED shop/web-1', 'DELETED default/db-0', 'ADDED shop/pending']);
    expect(names()).toEqual(['shop/late', 'shop/pending', 'shop/web-1']);
    expect(s.get('shop', 'web-1')?.metadata?.labels).toEqual({ v: '2' });
    expect(s.status().resourceVersion).toBe(api.resourceVersion);
  });

  it('advances its resourceVersion on a BOOKMARK and resumes from it', async () => {
    const s = open();
    await s.start();
    await until(() => api.watchCount === 1, 'the watch');
    const before = s.status().resourceVersion;
    api.addPod(testPod('shop', 'other-1', 'node-b')); // moves the version, not our pods
    api.addPod(testPod('shop', 'other-2', 'node-b'));
    expect(s.status().resourceVersion).toBe(before);
    api.sendBookmark();
    await until(() => s.status().resourceVersion === api.resourceVersion, 'the bookmark');
    expect(events).toHaveLength(2); // only the initial ADDED events

    const resumedBefore = watches().length;
    api.closeWatches(); // the server's watch timeout
    await until(() => watches().length === resumedBefore + 1 && api.watchCount === 1, 'the resumed watch');
    expect(watches().at(-1)!.query.resourceVersion).toBe(api.resourceVersion);
    expect(syncs()).toHaveLength(1); // resumed, no relist
  });

  it('on 410 Gone of an open watch, relists without losing or duplicating pods', async () => {
    const s = open();
    await s.start();
    await until(() => api.watchCount === 1, 'the watch');
    events = [];
    api.expireHistory(); // ERROR 410 on the open watch
    await until(() => relisted(s), 'the relist and new watch');
    expect(syncs()[1]!.query.resourceVersion).toBeUndefined(); // a consistent read after 410
    expect(events).toEqual([]); // unchanged pods are not re-announced
    expect(names()).toEqual(['default/db-0', 'shop/web-1']);
    api.addPod(testPod('shop', 'after', NODE));
    await until(() => events.length === 1, 'the event after the relist');
    expect(events).toEqual(['ADDED shop/after']);
  });

  it('after a restart that lost history (410 on resume), relist yields exactly the missed changes', async () => {
    const s = open();
    await s.start();
    await until(() => api.watchCount === 1, 'the watch');
    events = [];
    await api.stop();
    api.addPod(testPod('shop', 'new', NODE));
    api.deletePod('default', 'db-0');
    api.modifyPod('shop', 'web-1', (p) => { p.metadata!.annotations = { a: 'b' }; });
    api.expireHistory();
    await api.listen();
    await until(() => relisted(s), 'relist after 410');
    const resumed = watches().find((w) => w.query.resourceVersion !== api.resourceVersion);
    expect(resumed, 'the client first tried to resume from its old version').toBeDefined();
    expect(events.sort()).toEqual(['ADDED shop/new', 'DELETED default/db-0', 'MODIFIED shop/web-1']);
    expect(names()).toEqual(['shop/new', 'shop/web-1']);
  });

  it('reconnects with backoff after the API server restarts, resuming from its version', async () => {
    const s = open();
    await s.start();
    await until(() => api.watchCount === 1, 'the watch');
    events = [];
    await api.stop();
    await until(() => s.status().lastError !== undefined, 'the failure to be noticed');
    api.addPod(testPod('shop', 'during-outage', NODE));
    await api.listen();
    await until(() => events.length === 1, 'the change made during the outage');
    expect(events).toEqual(['ADDED shop/during-outage']);
    expect(syncs()).toHaveLength(1); // history was kept: resumed, no relist
    await until(() => s.status().lastError === undefined && s.status().watching, 'recovery');
  });

  it('start() waits for an unreachable API server, and stop() rejects a pending start', async () => {
    await api.stop();
    const s = open();
    const started = s.start();
    await new Promise((r) => setTimeout(r, 100));
    expect(s.synced()).toBe(false);
    expect(s.status().lastError).toMatch(/ECONNREFUSED/);
    await api.listen();
    await started;
    expect(names()).toEqual(['default/db-0', 'shop/web-1']);

    const s2 = new ApiSource({ kubeConfig: kubeConfig('http://127.0.0.1:9'), nodeName: NODE, logger: quiet, minBackoffMs: 20 });
    const rejected = expect(s2.start()).rejects.toThrow(/stopped before the first sync/);
    await s2.stop();
    await rejected;
  });

  it('reports missing RBAC with what to grant, and syncs once it is granted', async () => {
    api.forbidden = true;
    const s = open();
    const started = s.start();
    await until(() => s.status().lastError !== undefined, 'the failure');
    expect(s.status().lastError).toMatch(/HTTP 403.*needs list and watch on pods/);
    api.forbidden = false;
    await started;
    expect(names()).toEqual(['default/db-0', 'shop/web-1']);
  });

  it('abandons a watch that outlives its server-side timeout (a dead connection) and resumes', async () => {
    const s = open({ watchTimeoutSeconds: 1 });
    await s.start();
    await until(() => api.watchCount === 1, 'the first watch');
    const before = watches().length;
    api.stallWatches = true;
    api.closeWatches(); // the next watch is accepted, then silent
    await until(() => watches().length === before + 1, 'the stalled watch');
    api.stallWatches = false;
    api.addPod(testPod('shop', 'missed', NODE)); // never sent on the stalled watch
    await until(() => events.includes('ADDED shop/missed'), 'the resumed watch', 4000);
    // Resumed from the same version: the stalled watch delivered nothing.
    expect(watches()[before + 1]!.query.resourceVersion).toBe(watches()[before]!.query.resourceVersion);
    expect(syncs()).toHaveLength(1);
  });

  it('posts a Warning Event on a pod it cannot keep captured, naming this node', async () => {
    api.addPod(testPod('shop', 'sick-1', NODE));
    const s = open();
    await s.start();
    await s.podProblem('shop', 'sick-1', 'MeshcapRedirectLost', 'meshcap cannot restore the ebpf redirect of pod shop/sick-1: boom');
    expect(api.events).toHaveLength(1);
    expect(api.events[0]).toMatchObject({
      metadata: { generateName: 'sick-1.', namespace: 'shop' },
      involvedObject: { kind: 'Pod', namespace: 'shop', name: 'sick-1', uid: s.get('shop', 'sick-1')!.metadata!.uid },
      reason: 'MeshcapRedirectLost',
      type: 'Warning',
      source: { component: 'meshcap-agent', host: NODE },
      message: expect.stringContaining('shop/sick-1'),
    });
  });

  it('requires a node name', () => {
    expect(() => new ApiSource({ kubeConfig: kubeConfig(api.url), nodeName: '' })).toThrow(/node name/);
  });
});

describe('ApiSource and a LIST that never answers (a dead connection mid-request)', () => {
  it('stop() ends it at once, and kubeRequest gives up after its timeout with the request named', async () => {
    const api = await KubeApiServer.start({ watchList: 'refuse' });
    api.stallLists = true;
    const src = new ApiSource({ kubeConfig: kubeConfig(api.url), nodeName: NODE, logger: quiet, minBackoffMs: 20 });
    try {
      const started = src.start();
      const rejected = expect(started).rejects.toThrow(/stopped before the first sync/);
      await until(() => api.requests.some((r) => r.query.watch === undefined), 'the LIST');
      const t0 = Date.now();
      await src.stop();
      expect(Date.now() - t0).toBeLessThan(1000);
      await rejected;
      await expect(kubeRequest(kubeConfig(api.url), '/api/v1/pods', { timeoutMs: 200 })).rejects.toThrow(/^GET \/api\/v1\/pods: network timeout/);
    } finally {
      await api.stop();
    }
  });
});

describe('ApiSource against a server that ignores sendInitialEvents (before Kubernetes 1.27)', () => {
  it('lists instead once no end bookmark came in time, and keeps listing after a 410', async () => {
    const api = await KubeApiServer.start({ watchList: 'ignore' });
    api.addPod(testPod('shop', 'web-1', NODE));
    const src = new ApiSource({ kubeConfig: kubeConfig(api.url), nodeName: NODE, logger: quiet, minBackoffMs: 20, initialEventsTimeoutMs: 300 });
    try {
      const t0 = Date.now();
      await src.start();
      expect(Date.now() - t0).toBeGreaterThanOrEqual(300);
      expect(src.list().map((p) => p.metadata!.name)).toEqual(['web-1']);
      const sent = () => api.requests.map((r) => (r.query.watch ? (r.query.sendInitialEvents ? 'watch-list' : 'watch') : 'list'));
      await until(() => src.status().watching && sent().includes('watch'), 'the watch');
      expect(sent()).toEqual(['watch-list', 'list', 'watch']);
      api.expireHistory();
      await until(() => sent().filter((k) => k === 'list').length === 2, 'the relist');
      expect(sent().filter((k) => k === 'watch-list')).toHaveLength(1);
    } finally {
      await src.stop();
      await api.stop();
    }
  });
});
