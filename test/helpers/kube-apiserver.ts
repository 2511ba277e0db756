// An in-process Kubernetes API server for pods, speaking the real list/watch
// HTTP protocol closely enough that @kubernetes/client-node cannot tell:
//   GET /api/v1/pods, /api/v1/namespaces/{ns}/pods          -> PodList
//   ... ?watch=1|true                                       -> JSON lines
// with resourceVersion semantics (unset/"0": current state as ADDED events;
// N: every change after N), fieldSelector (spec.nodeName, metadata.name,
// metadata.namespace; =, ==, !=) including the ADDED/DELETED a watcher sees
// when a pod moves in or out of its selector, allowWatchBookmarks,
// timeoutSeconds, and 410 Gone (an ERROR event carrying a Status) when a watch
// asks for history that was compacted away. Watch-list (sendInitialEvents=true,
// resourceVersionMatch=NotOlderThan: the current state as ADDED events, then a
// BOOKMARK marked k8s.io/initial-events-end) as Kubernetes 1.34+ streams it,
// or refused with 422 as 1.30-1.33 do with the WatchList gate off, or ignored
// as servers before 1.27 do (options.watchList). LIST pages with limit/continue
// (pages after the first show the pods as they are then, not as a snapshot
// of the first page's resourceVersion, as the real server would).
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { V1Pod } from '@kubernetes/client-node';

type EventType = 'ADDED' | 'MODIFIED' | 'DELETED';

interface HistoryEvent {
  rv: number;
  type: EventType;
  pod: V1Pod;
  /** The state before a MODIFIED, to compute selector transitions. */
  prev?: V1Pod;
}

interface Watcher {
  res: ServerResponse;
  match: (pod: V1Pod) => boolean;
  bookmarks: boolean;
  timers: NodeJS.Timeout[];
}

export interface RecordedRequest {
  method: string;
  path: string;
  query: Record<string, string>;
}

export interface KubeApiServerOptions {
  /** Send a BOOKMARK to bookmark-enabled watches this often (off by default). */
  bookmarkIntervalMs?: number;
  /** How a watch with sendInitialEvents=true is answered (default 'stream', as Kubernetes 1.34+). */
  watchList?: 'stream' | 'refuse' | 'ignore';
}

export class KubeApiServer {
  /** Every request received, in order (tests assert on the client's protocol use). */
  readonly requests: RecordedRequest[] = [];
  /** Events POSTed to /api/v1/namespaces/NS/events, in order. */
  readonly events: Record<string, unknown>[] = [];
  /** While true, every request gets 403 Forbidden (RBAC missing). */
  forbidden = false;
  /**
   * While true, new watches behave like a dead connection: accepted, then
   * silent forever (no events, no timeoutSeconds end).
   */
  stallWatches = false;
  /** While true, LISTs are accepted and never answered (a dead connection mid-request). */
  stallLists = false;
  private server: Server | undefined;
  private port = 0;
  private rv = 1000;
  private compactedRv = 0;
  private readonly pods = new Map<string, V1Pod>();
  private history: HistoryEvent[] = [];
  private readonly watchers = new Set<Watcher>();

  private constructor(private readonly opts: KubeApiServerOptions) {}

  static async start(opts: KubeApiServerOptions = {}): Promise<KubeApiServer> {
    const s = new KubeApiServer(opts);
    await s.listen();
    return s;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  get resourceVersion(): string {
    return String(this.rv);
  }

  /** Open watch connections right now. */
  get watchCount(): number {
    return this.watchers.size;
  }

  /** (Re)starts listening, on the same port after a stop(); state survives. */
  async listen(): Promise<void> {
    if (this.server) return;
    const server = createServer((req, res) => this.handle(req, res));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.port, '127.0.0.1', () => resolve());
    });
    this.port = (server.address() as AddressInfo).port;
    this.server = server;
  }

  /** Stops like a crashed API server: every connection is cut. */
  async stop(): Promise<void> {
    const server = this.server;
    if (!server) return;
    this.server = undefined;
    // No clean end of the chunked streams: the sockets just die.
    for (const w of this.watchers) for (const t of w.timers) clearTimeout(t);
    this.watchers.clear();
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  addPod(pod: V1Pod): V1Pod {
    const ns = pod.metadata?.namespace ?? 'default';
    const name = pod.metadata?.name;
    if (!name) throw new Error('addPod: metadata.name is required');
    if (this.pods.has(`${ns}/${name}`)) throw new Error(`addPod: ${ns}/${name} already exists`);
    const stored: V1Pod = clone({
      apiVersion: 'v1',
      kind: 'Pod',
      ...pod,
      metadata: { ...pod.metadata, name, namespace: ns, uid: randomUUID(), creationTimestamp: new Date().toISOString() as unknown as Date },
    });
    this.commit('ADDED', stored);
    return clone(stored);
  }

  modifyPod(namespace: string, name: string, mutate: (pod: V1Pod) => void): V1Pod {
    const prev = this.mustGet(namespace, name);
    const next = clone(prev);
    mutate(next);
    this.commit('MODIFIED', next, prev);
    return clone(next);
  }

  deletePod(namespace: string, name: string): V1Pod {
    const prev = this.mustGet(namespace, name);
    this.commit('DELETED', clone(prev));
    return clone(prev);
  }

  /**
   * Compacts history, as etcd does: a watch resuming from any version seen
   * so far gets 410 Gone. Open watches get the ERROR event and are closed,
   * as the apiserver's watch cache does when it cannot serve them anymore.
   */
  expireHistory(): void {
    this.rv += 1; // a write to some other resource; versions are cluster-wide
    this.compactedRv = this.rv;
    this.history = [];
    for (const w of [...this.watchers]) {
      writeEvent(w.res, 'ERROR', goneStatus());
      this.endWatch(w);
    }
  }

  /** Ends every open watch normally, like the apiserver's watch timeout. */
  closeWatches(): void {
    for (const w of [...this.watchers]) this.endWatch(w);
  }

  /** Sends a BOOKMARK at the current version to bookmark-enabled watches. */
  sendBookmark(): void {
    for (const w of this.watchers) if (w.bookmarks) this.bookmark(w);
  }

  private mustGet(namespace: string, name: string): V1Pod {
    const pod = this.pods.get(`${namespace}/${name}`);
    if (!pod) throw new Error(`pod ${namespace}/${name} does not exist`);
    return pod;
  }

  private commit(type: EventType, pod: V1Pod, prev?: V1Pod): void {
    this.rv += 1;
    pod.metadata = { ...pod.metadata, resourceVersion: String(this.rv) };
    const key = `${pod.metadata.namespace}/${pod.metadata.name}`;
    if (type === 'DELETED') this.pods.delete(key);
    else this.pods.set(key, pod);
    const ev: HistoryEvent = { rv: this.rv, type, pod: clone(pod), ...(prev ? { prev: clone(prev) } : {}) };
    this.history.push(ev);
    for (const w of this.watchers) this.deliver(w, ev);
  }

  private deliver(w: Watcher, ev: HistoryEvent): void {
    const now = w.match(ev.pod);
    const before = ev.prev ? w.match(ev.prev) : false;
    let type: EventType | undefined;
    if (ev.type === 'ADDED') type = now ? 'ADDED' : undefined;
    else if (ev.type === 'DELETED') type = now ? 'DELETED' : undefined;
    else if (before && now) type = 'MODIFIED';
    else if (!before && now) type = 'ADDED';
    else if (before && !now) type = 'DELETED';
    if (type) writeEvent(w.res, type, ev.pod);
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const url = new URL(req.url ?? '/', 'http://x');
    const query = Object.fromEntries(url.searchParams);
    this.requests.push({ method: req.method ?? 'GET', path: url.pathname, query });

    if (this.forbidden) {
      return sendStatus(res, 403, 'Forbidden', `pods is forbidden: User "system:serviceaccount:meshcap:meshcap" cannot list resource "pods" in API group "" at the cluster scope`);
    }
    const ev = /^\/api\/v1\/namespaces\/([^/]+)\/events$/.exec(url.pathname);
    if (req.method === 'POST' && ev) {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>;
        this.events.push(body);
        res.writeHead(201, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ ...body, kind: 'Event', apiVersion: 'v1' }));
      });
      return;
    }
    const m = /^\/api\/v1\/(?:namespaces\/([^/]+)\/)?pods$/.exec(url.pathname);
    if (req.method !== 'GET' || !m) return sendStatus(res, 404, 'NotFound', `the server could not find the requested resource (${req.method} ${url.pathname})`);
    const namespace = m[1] ? decodeURIComponent(m[1]) : undefined;

    let selector: (pod: V1Pod) => boolean;
    try {
      selector = parseFieldSelector(query.fieldSelector ?? '');
    } catch (err) {
      return sendStatus(res, 400, 'BadRequest', (err as Error).message);
    }
    if (query.labelSelector) return sendStatus(res, 400, 'BadRequest', 'labelSelector is not supported by this test server');
    const match = (pod: V1Pod) => (namespace === undefined || pod.metadata?.namespace === namespace) && selector(pod);

    const rvParam = query.resourceVersion ?? '';
    const rv = rvParam === '' ? undefined : Number(rvParam);
    if (rv !== undefined && !Number.isInteger(rv)) return sendStatus(res, 400, 'BadRequest', `invalid resourceVersion "${rvParam}"`);
    if (rv !== undefined && rv > this.rv) return sendStatus(res, 504, 'Timeout', `Too large resource version: ${rv}, current: ${this.rv}`);

    if (query.watch === 'true' || query.watch === '1') return this.watch(res, match, rv, query);
    if (this.stallLists) return;
    if (query.resourceVersionMatch === 'Exact' && rv !== undefined && rv !== 0 && rv < this.compactedRv) {
      return sendStatus(res, 410, 'Expired', `too old resource version: ${rv} (${this.compactedRv})`);
    }
    let items = [...this.pods.values()].filter(match).sort(byKey);
    let listRv = this.rv;
    if (query.continue) {
      const [rvOfList, after] = JSON.parse(Buffer.from(query.continue, 'base64url').toString('utf8')) as [number, string];
      listRv = rvOfList;
      items = items.filter((p) => keyOf(p) > after);
    }
    const limit = Number(query.limit ?? '0');
    let next: string | undefined;
    if (limit > 0 && items.length > limit) {
      items = items.slice(0, limit);
      next = Buffer.from(JSON.stringify([listRv, keyOf(items.at(-1)!)])).toString('base64url');
    }
    sendJson(res, 200, { kind: 'PodList', apiVersion: 'v1', metadata: { resourceVersion: String(listRv), ...(next ? { continue: next } : {}) }, items: items.map(clone) });
  }

  private watch(res: ServerResponse, match: (pod: V1Pod) => boolean, rv: number | undefined, query: Record<string, string>): void {
    if (query.sendInitialEvents !== undefined && (this.opts.watchList ?? 'stream') !== 'ignore') {
      // kube-apiserver's ValidateListOptions, before the watch starts
      const invalid = (why: string) => sendStatus(res, 422, 'Invalid', `ListOptions.meta.k8s.io "" is invalid: ${why}`);
      if (this.opts.watchList === 'refuse') return invalid('sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled');
      if (query.resourceVersionMatch !== 'NotOlderThan') return invalid('resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan');
      if (query.allowWatchBookmarks !== 'true') return invalid('allowWatchBookmarks: Forbidden: sendInitialEvents requires allowWatchBookmarks=true');
    }
    res.writeHead(200, { 'Content-Type': 'application/json', 'Transfer-Encoding': 'chunked' });
    res.flushHeaders();
    if (rv !== undefined && rv !== 0 && rv < this.compactedRv) {
      // The real apiserver answers 200 and then an ERROR event with a Status.
      writeEvent(res, 'ERROR', goneStatus(rv, this.compactedRv));
      res.end();
      return;
    }
    if (this.stallWatches) {
      res.write(''); // headers are out; nothing else ever comes
      return;
    }
    const w: Watcher = { res, match, bookmarks: query.allowWatchBookmarks === 'true', timers: [] };
    if (query.sendInitialEvents === 'true' && (this.opts.watchList ?? 'stream') === 'stream') {
      // the state at least as new as rv (unset: now), then the end bookmark
      for (const pod of [...this.pods.values()].filter(match).sort(byKey)) writeEvent(res, 'ADDED', pod);
      writeEvent(res, 'BOOKMARK', { kind: 'Pod', apiVersion: 'v1', metadata: { resourceVersion: String(this.rv), annotations: { 'k8s.io/initial-events-end': 'true' } } });
    } else if (rv === undefined || rv === 0) {
      // "Get state and start at most recent": synthetic ADDED for everything.
      for (const pod of [...this.pods.values()].filter(match).sort(byKey)) writeEvent(res, 'ADDED', pod);
    } else {
      for (const ev of this.history) if (ev.rv > rv) this.deliver(w, ev);
    }
    this.watchers.add(w);
    res.on('close', () => this.endWatch(w));
    const timeout = Number(query.timeoutSeconds ?? '0');
    if (timeout > 0) w.timers.push(setTimeout(() => this.endWatch(w), timeout * 1000));
    if (w.bookmarks && this.opts.bookmarkIntervalMs) {
      w.timers.push(setInterval(() => this.bookmark(w), this.opts.bookmarkIntervalMs));
    }
  }

  private bookmark(w: Watcher): void {
    writeEvent(w.res, 'BOOKMARK', { kind: 'Pod', apiVersion: 'v1', metadata: { resourceVersion: String(this.rv) } });
  }

  private endWatch(w: Watcher): void {
    if (!this.watchers.delete(w) && w.res.writableEnded) return;
    for (const t of w.timers) clearTimeout(t);
    if (!w.res.writableEnded) w.res.end();
  }
}

/** A Pod for tests: scheduled to `nodeName`, with one plain container. */
export function testPod(namespace: string, name: string, nodeName: string, extra: Partial<V1Pod> = {}): V1Pod {
  return {
    ...extra,
    metadata: { name, namespace, ...extra.metadata },
    spec: { nodeName, containers: [{ name: 'app', image: 'app' }], ...extra.spec },
  };
}

function parseFieldSelector(sel: string): (pod: V1Pod) => boolean {
  const fields: Record<string, (p: V1Pod) => string | undefined> = {
    'spec.nodeName': (p) => p.spec?.nodeName ?? '',
    'metadata.name': (p) => p.metadata?.name,
    'metadata.namespace': (p) => p.metadata?.namespace,
  };
  const terms = sel.split(',').filter(Boolean).map((term) => {
    const m = /^([^!=]+)(==|!=|=)(.*)$/.exec(term);
    if (!m) throw new Error(`invalid field selector term "${term}"`);
    const [, field, op, value] = m as unknown as [string, string, string, string];
    const get = fields[field];
    if (!get) throw new Error(`field label not supported: ${field}`);
    return (p: V1Pod) => (op === '!=' ? get(p) !== value : get(p) === value);
  });
  return (p) => terms.every((t) => t(p));
}

function goneStatus(rv?: number, compacted?: number) {
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message: rv !== undefined ? `too old resource version: ${rv} (${compacted})` : 'too old resource version',
    reason: 'Expired',
    code: 410,
  };
}

function writeEvent(res: ServerResponse, type: string, object: unknown): void {
  if (!res.writableEnded) res.write(`${JSON.stringify({ type, object })}\n`);
}

function sendJson(res: ServerResponse, code: number, body: unknown): void {
  res.writeHead(code, { 'Content-Type': 'application/json' });
  res.end(JSON.stringify(body));
}

function sendStatus(res: ServerResponse, code: number, reason: string, message: string): void {
  sendJson(res, code, { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code });
}

function keyOf(p: V1Pod): string {
  return `${p.metadata?.namespace}/${p.metadata?.name}`;
}

function byKey(a: V1Pod, b: V1Pod): number {
  const ka = keyOf(a);
  const kb = keyOf(b);
  return ka < kb ? -1 : ka > kb ? 1 : 0;
}

function clone<T>(v: T): T {
  return structuredClone(v);
}
