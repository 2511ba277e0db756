// The test API server's own protocol, checked with plain HTTP, so the
// ApiSource tests stand on a server that behaves like the real one.
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { request } from 'node:http';
import { KubeApiServer, testPod } from '../../helpers/kube-apiserver.js';

interface WatchEvent { type: string; object: { kind?: string; code?: number; metadata?: { name?: string; resourceVersion?: string } } }

/** GETs a watch URL and collects its events until the server ends it or `n` arrive. */
function watch(url: string, n: number): Promise<WatchEvent[]> {
  return new Promise((resolve, reject) => {
    const events: WatchEvent[] = [];
    let buf = '';
    const req = request(url, (res) => {
      expect(res.statusCode).toBe(200);
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        buf += chunk;
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
          events.push(JSON.parse(buf.slice(0, i)) as WatchEvent);
          buf = buf.slice(i + 1);
        }
        if (events.length >= n) {
          req.destroy();
          resolve(events);
        }
      });
      res.on('end', () => resolve(events));
    });
    req.on('error', reject);
    req.end();
  });
}

async function getJson(url: string): Promise<{ status: number; body: any }> {
  const res = await fetch(url);
  return { status: res.status, body: await res.json() };
}

describe('KubeApiServer (test helper)', () => {
  let api: KubeApiServer;
  beforeEach(async () => {
    api = await KubeApiServer.start();
    api.addPod(testPod('a', 'p1', 'n1'));
    api.addPod(testPod('b', 'p2', 'n1'));
    api.addPod(testPod('a', 'p3', 'n2'));
  });
  afterEach(() => api.stop());

  it('lists all, per namespace, and by field selector, with the list resourceVersion', async () => {
    const all = await getJson(`${api.url}/api/v1/pods`);
    expect(all.body.kind).toBe('PodList');
    expect(all.body.metadata.resourceVersion).toBe(api.resourceVersion);
    expect(all.body.items.map((p: any) => p.metadata.name)).toEqual(['p1', 'p3', 'p2']);
    const ns = await getJson(`${api.url}/api/v1/namespaces/a/pods?fieldSelector=spec.nodeName%3Dn1`);
    expect(ns.body.items.map((p: any) => p.metadata.name)).toEqual(['p1']);
    const not = await getJson(`${api.url}/api/v1/pods?fieldSelector=spec.nodeName!%3Dn1`);
    expect(not.body.items.map((p: any) => p.metadata.name)).toEqual(['p3']);
    expect((await getJson(`${api.url}/api/v1/pods?fieldSelector=status.phase%3DRunning`)).status).toBe(400);
    expect((await getJson(`${api.url}/api/v1/services`)).status).toBe(404);
  });

  it('watch without a version starts with ADDED for current state; with a version it replays later changes', async () => {
    const rv0 = api.resourceVersion;
    const initial = await watch(`${api.url}/api/v1/namespaces/a/pods?watch=1&timeoutSeconds=1`, 2);
    expect(initial.map((e) => `${e.type} ${e.object.metadata!.name}`)).toEqual(['ADDED p1', 'ADDED p3']);

    api.modifyPod('a', 'p1', (p) => { p.metadata!.labels = { x: '1' }; });
    api.modifyPod('a', 'p3', (p) => { p.spec!.nodeName = 'n1'; }); // moves into the selector
    api.deletePod('b', 'p2');
    const replay = await watch(`${api.url}/api/v1/pods?watch=true&resourceVersion=${rv0}&fieldSelector=spec.nodeName%3Dn1`, 3);
    expect(replay.map((e) => `${e.type} ${e.object.metadata!.name}`)).toEqual(['MODIFIED p1', 'ADDED p3', 'DELETED p2']);
    expect(replay[2]!.object.metadata!.resourceVersion).toBe(api.resourceVersion);
  });

  it('answers a compacted version with an ERROR 410 Status event, and sends bookmarks only when allowed', async () => {
    const old = api.resourceVersion;
    api.expireHistory();
    const gone = await watch(`${api.url}/api/v1/pods?watch=true&resourceVersion=${old}`, 1);
    expect(gone).toEqual([{ type: 'ERROR', object: expect.objectContaining({ kind: 'Status', code: 410, reason: 'Expired' }) }]);

    const p = watch(`${api.url}/api/v1/pods?watch=true&resourceVersion=${api.resourceVersion}&allowWatchBookmarks=true`, 1);
    const q = watch(`${api.url}/api/v1/pods?watch=true&resourceVersion=${api.resourceVersion}&timeoutSeconds=1`, 1);
    while (api.watchCount < 2) await new Promise((r) => setTimeout(r, 5));
    api.sendBookmark();
    expect(await p).toEqual([{ type: 'BOOKMARK', object: { kind: 'Pod', apiVersion: 'v1', metadata: { resourceVersion: api.resourceVersion } } }]);
    expect(await q).toEqual([]); // no bookmark; ended by timeoutSeconds
  });
});
