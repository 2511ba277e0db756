// Pods of this node from the Kubernetes API: LIST, then WATCH from the list's
// resourceVersion with bookmarks, the reflector protocol client-go uses.
//
// Built on client-node's Watch (the streaming primitive) and KubeConfig, with
// LIST pages and the other calls as plain REST (src/kube/rest.ts), rather than
// its ListWatch/makeInformer, because ListWatch cannot ask for bookmarks,
// stops for good on any non-410 error, and has no backoff: a node agent must
// ride out API server restarts on its own. Both come from a bundle without
// client-node's generated API (src/kube/client-node.ts).
import { existsSync, readFileSync } from 'node:fs';
import { dirname, isAbsolute, resolve } from 'node:path';
import type { User, V1Pod, V1PodList } from '@kubernetes/client-node';
import { parse as parseYaml } from 'yaml';
import { pino, type Logger } from 'pino';
import { KubeConfig, Watch } from './client-node.js';
import { CachedPodSource } from './pod-cache.js';
import { KubeApiError, kubeRequest } from './rest.js';
import type { PodChangeListener, PodSource } from './pod-source.js';

export interface ApiSourceOptions {
  kubeConfig: KubeConfig;
  /** This node's name (the DaemonSet passes spec.nodeName via the downward API). */
  nodeName: string;
  logger?: Logger;
  /** First retry delay after a failure; doubles up to maxBackoffMs. */
  minBackoffMs?: number;
  maxBackoffMs?: number;
  /**
   * Asks the API server to end each watch after this long, so a silently dead
   * connection is noticed; default random in [300, 600) s, as client-go does.
   */
  watchTimeoutSeconds?: number;
  /** Pods per LIST page (default 500). */
  listPageSize?: number;
  /**
   * How long a watch-list may stream before its end bookmark; past it the
   * server is taken to ignore sendInitialEvents (Kubernetes before 1.27) and
   * the pods are listed instead. Default 60 s.
   */
  initialEventsTimeoutMs?: number;
}

export interface ApiSourceStatus {
  synced: boolean;
  resourceVersion: string;
  watching: boolean;
  /** The last failure since the watch was last healthy, if any. */
  lastError?: string;
}

/** Pods per LIST page (client-go's reflector pages by 500 too). */
const LIST_PAGE = 500;

const SERVICE_ACCOUNT_TOKEN = '/var/run/secrets/kubernetes.io/serviceaccount/token';

/**
 * Kubernetes credentials: the given kubeconfig file; else in-cluster (service
 * account) when running in a pod; else $KUBECONFIG or ~/.kube/config.
 */
export function loadKubeConfig(path?: string): KubeConfig {
  const kc = new KubeConfig();
  if (path) {
    kc.loadFromFile(path);
    followTokenFiles(kc, path);
  } else if (process.env.KUBERNETES_SERVICE_HOST && existsSync(SERVICE_ACCOUNT_TOKEN)) {
    kc.loadFromCluster();
  } else {
    kc.loadFromDefault();
    // loadFromDefault quietly falls back to http://localhost:8080.
    const cluster = kc.getCurrentCluster();
    if (!cluster || (cluster.name === 'cluster' && cluster.server === 'http://localhost:8080')) {
      throw new Error('no Kubernetes credentials found: pass a kubeconfig file, set KUBECONFIG, or run in a pod with a service account token');
    }
  }
  if (!kc.getCurrentCluster()) throw new Error(`kubeconfig ${path ?? '(default)'} has no current cluster`);
  return kc;
}

/**
 * A kubeconfig user with `tokenFile` (client-go's key; client-node knows only
 * `token-file`, and reads that once, at load) gets the token-file
 * authenticator the in-cluster config uses, which re-reads the file every
 * 60 s: a projected token that kubelet or an operator rotates keeps working
 * after the first one expires.
 */
function followTokenFiles(kc: KubeConfig, path: string): void {
  let raw: { users?: { name?: string; user?: Record<string, unknown> }[] };
  try {
    raw = parseYaml(readFileSync(path, 'utf8')) as typeof raw;
  } catch {
    return; // loadFromFile accepted it; nothing more to learn here
  }
  for (const entry of raw?.users ?? []) {
    const file = entry.user?.tokenFile ?? entry.user?.['token-file'];
    if (typeof file !== 'string' || !file || !entry.name) continue;
    const i = kc.users.findIndex((u) => u.name === entry.name);
    if (i < 0 || kc.users[i]!.authProvider || kc.users[i]!.exec) continue;
    const tokenFile = isAbsolute(file) ? file : resolve(dirname(path), file);
    const { token: _staticToken, ...rest } = kc.users[i]!;
    kc.users[i] = { ...rest, authProvider: { name: 'tokenFile', config: { tokenFile } } } as User;
  }
}

/** The bookmark annotation that ends a watch-list's initial events. */
const INITIAL_EVENTS_END = 'k8s.io/initial-events-end';

/** The API server cannot stream the initial pods on the watch (no WatchList): list them instead. */
class WatchListRefused extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'WatchListRefused';
  }
}

class GoneError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'GoneError';
  }
}

export class ApiSource extends CachedPodSource implements PodSource {
  private readonly kc: KubeConfig;
  private readonly nodeName: string;
  private readonly log: Logger;
  private readonly minBackoffMs: number;
  private readonly maxBackoffMs: number;
  private readonly watchTimeoutSeconds: number | undefined;
  private readonly listPageSize: number;
  private readonly initialEventsTimeoutMs: number;
  private rv = '';
  private isSynced = false;
  /** The API server refused a watch-list once: full syncs LIST from then on. */
  private watchListRefused = false;
  private watching = false;
  private lastError: string | undefined;
  private loop: Promise<void> | undefined;
  private abortWatch: (() => void) | undefined;
  private watchEstablishedAt: number | undefined;
  private wakeSleep: (() => void) | undefined;
  private syncWaiters: { resolve(): void; reject(err: Error): void }[] = [];
  /** Aborts a LIST in flight when the source stops. */
  private readonly stopping = new AbortController();

  constructor(opts: ApiSourceOptions) {
    super();
    if (!opts.nodeName) throw new Error('ApiSource needs the node name (set NODE_NAME from spec.nodeName)');
    this.kc = opts.kubeConfig;
    this.nodeName = opts.nodeName;
    this.log = (opts.logger ?? pino({ name: 'meshcap' })).child({ component: 'pod-watch', node: opts.nodeName });
    this.minBackoffMs = opts.minBackoffMs ?? 200;
    this.maxBackoffMs = opts.maxBackoffMs ?? 30_000;
    this.watchTimeoutSeconds = opts.watchTimeoutSeconds;
    this.listPageSize = opts.listPageSize ?? LIST_PAGE;
    this.initialEventsTimeoutMs = opts.initialEventsTimeoutMs ?? 60_000;
  }

  /** Starts list+watch; resolves after the first successful LIST. */
  start(): Promise<void> {
    if (this.stopped) return Promise.reject(new Error('pod watch was stopped'));
    if (this.isSynced) return Promise.resolve();
    const synced = new Promise<void>((resolve, reject) => this.syncWaiters.push({ resolve, reject }));
    this.loop ??= this.run();
    return synced;
  }

  synced(): boolean {
    return this.isSynced;
  }

  status(): ApiSourceStatus {
    return {
      synced: this.isSynced,
      resourceVersion: this.rv,
      watching: this.watching,
      ...(this.lastError ? { lastError: this.lastError } : {}),
    };
  }

  /**
   * A Warning Event on the pod, as kubelet posts them: what `kubectl describe
   * pod` shows the pod's owner when meshcap cannot keep it captured.
   */
  podProblem(namespace: string, name: string, reason: string, message: string): Promise<void> {
    return this.podEvent(namespace, name, 'Warning', reason, message);
  }

  async podEvent(namespace: string, name: string, type: 'Normal' | 'Warning', reason: string, message: string): Promise<void> {
    const now = new Date();
    const uid = this.get(namespace, name)?.metadata?.uid;
    await kubeRequest(this.kc, `/api/v1/namespaces/${encodeURIComponent(namespace)}/events`, {
      method: 'POST',
      body: {
        apiVersion: 'v1',
        kind: 'Event',
        metadata: { generateName: `${name}.`, namespace },
        involvedObject: { apiVersion: 'v1', kind: 'Pod', namespace, name, ...(uid ? { uid } : {}) },
        reason,
        message,
        type,
        source: { component: 'meshcap-agent', host: this.nodeName },
        reportingComponent: 'meshcap-agent',
        reportingInstance: this.nodeName,
        firstTimestamp: now.toISOString(),
        lastTimestamp: now.toISOString(),
        count: 1,
      },
    });
  }

  /** Repair's --repair=label (needs pods patch). */
  async labelPod(namespace: string, name: string, labels: Record<string, string>): Promise<void> {
    await kubeRequest(this.kc, podPath(namespace, name), { method: 'PATCH', body: { metadata: { labels } }, contentType: 'application/merge-patch+json' });
  }

  /** Repair's --repair=delete (needs pods delete); the UID precondition never deletes a newer pod of the same name. */
  async deletePod(namespace: string, name: string, uid?: string): Promise<void> {
    await kubeRequest(this.kc, podPath(namespace, name), { method: 'DELETE', ...(uid ? { body: { apiVersion: 'v1', kind: 'DeleteOptions', preconditions: { uid } } } : {}) });
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.stopping.abort();
    this.abortWatch?.();
    this.wakeSleep?.();
    this.cache.cancelWaiters();
    for (const w of this.syncWaiters.splice(0)) w.reject(new Error('pod watch stopped before the first sync'));
    await this.loop;
  }

  private get fieldSelector(): string {
    return `spec.nodeName=${this.nodeName}`;
  }

  private async run(): Promise<void> {
    let backoff = this.minBackoffMs;
    let previousWasGone = false;
    while (!this.stopped) {
      this.watchEstablishedAt = undefined;
      try {
        if (!this.rv && this.watchListRefused) await this.relist();
        // without a resourceVersion the watch streams the node's pods first (a watch-list)
        await this.watchOnce();
        previousWasGone = false;
      } catch (err) {
        if (this.stopped) break;
        if (err instanceof GoneError) {
          this.log.info({ resourceVersion: this.rv }, 'pod watch resourceVersion expired (410 Gone); relisting');
          this.rv = '';
          // A second 410 straight after a fresh LIST means something is off.
          if (previousWasGone) backoff = await this.pause(backoff);
          previousWasGone = true;
          continue;
        }
        if (err instanceof WatchListRefused) {
          this.watchListRefused = true;
          this.log.info({ reason: err.message }, 'the API server does not stream the initial pods (WatchList: Kubernetes 1.34 and later, or its feature gate); listing them instead');
          continue;
        }
        this.lastError = describe(err);
        this.log.warn({ err: this.lastError, retryInMs: backoff }, 'pod list/watch failed; retrying');
      }
      // A watch that had been healthy for a while restarts at the shortest
      // delay; one that keeps failing or ending at once (a proxy cutting
      // streams, say) backs off instead of hot-looping.
      const healthyFor = this.watchEstablishedAt === undefined ? 0 : Date.now() - this.watchEstablishedAt;
      if (healthyFor > 1000) backoff = this.minBackoffMs;
      else if (!this.stopped) backoff = await this.pause(backoff);
    }
    this.watching = false;
  }

  /** The node's pods are these (a LIST or a watch-list's initial events): the cache follows, the first time resolves start(). */
  private adopt(views: readonly V1Pod[], how: 'list' | 'watch-list'): void {
    this.cache.replaceAll(views);
    if (!this.isSynced) {
      this.isSynced = true;
      this.log.info({ pods: views.length, resourceVersion: this.rv, how }, 'pods of this node listed');
      for (const w of this.syncWaiters.splice(0)) w.resolve();
    }
  }

  /**
   * The fallback for API servers without watch-list: a LIST, then a watch
   * from its resourceVersion. The first LIST may come from the API server's
   * watch cache ("0"), which ignores the page size and answers every pod of
   * the node in one body; after a 410 it asks for a consistent read, paged.
   */
  private async relist(): Promise<void> {
    const resourceVersion = this.isSynced ? undefined : '0';
    // Each page is cut to its compact views before the next is asked for.
    const views: V1Pod[] = [];
    let cont: string | undefined;
    let rv = '';
    do {
      let page;
      try {
        page = await kubeRequest<V1PodList & { metadata?: { continue?: string } }>(this.kc, '/api/v1/pods', {
          signal: this.stopping.signal,
          query: {
            fieldSelector: this.fieldSelector,
            limit: this.listPageSize,
            ...(cont ? { continue: cont } : { resourceVersion }),
          },
        });
      } catch (err) {
        // an expired continue token is a 410 too: start over with a fresh list
        if ((err as { code?: number }).code === 410) throw new GoneError('LIST answered 410 Gone');
        throw err;
      }
      if (this.stopped) return;
      for (const pod of page.items ?? []) views.push(this.cache.view(pod));
      rv = page.metadata?.resourceVersion ?? '';
      cont = page.metadata?.continue || undefined;
    } while (cont);
    if (!rv) throw new Error('pod LIST returned no resourceVersion');
    this.rv = rv;
    this.adopt(views, 'list');
  }

  /**
   * One watch request; resolves with the number of events when it ends
   * normally. Without a resourceVersion it is a watch-list (KEP-3157, what
   * client-go's reflector does): the API server first sends every pod of the
   * node as an ADDED event, one JSON line each, then a bookmark marked
   * `k8s.io/initial-events-end` with the version they add up to. Each line is
   * cut to its compact view as it arrives, so the node's pods never sit in
   * memory as one body (a LIST from the watch cache answers them all at once:
   * ~12 KB of JSON per Istio pod, over 100 MB at 10,000 pods).
   */
  private watchOnce(): Promise<number> {
    // stop() during a LIST: no watch to open (stop() aborts only the one already open)
    if (this.stopped) return Promise.resolve(0);
    const listing = !this.rv;
    return new Promise<number>((resolve, reject) => {
      let events = 0;
      let failure: Error | undefined;
      let controller: AbortController | undefined;
      let abortRequested = false;
      // the watch-list's initial pods, by namespace/name, until its end bookmark
      let initial: Map<string, V1Pod> | undefined = listing ? new Map() : undefined;
      const abort = () => {
        abortRequested = true;
        controller?.abort();
      };
      this.abortWatch = abort;

      const onEvent = (type: string, obj: unknown) => {
        if (abortRequested) return;
        const object = obj as V1Pod & { code?: number; message?: string };
        if (initial) {
          const key = `${object.metadata?.namespace ?? ''}/${object.metadata?.name ?? ''}`;
          switch (type) {
            case 'ADDED':
            case 'MODIFIED':
              initial.set(key, this.cache.view(object));
              return;
            case 'DELETED':
              initial.delete(key);
              return;
            case 'BOOKMARK': {
              if (object.metadata?.annotations?.[INITIAL_EVENTS_END] !== 'true') return;
              const rv = object.metadata?.resourceVersion;
              if (!rv) {
                failure = new Error('the watch-list\'s end bookmark carries no resourceVersion');
                abort();
                return;
              }
              this.rv = rv;
              const views = [...initial.values()];
              initial = undefined;
              clearTimeout(initialTimer);
              this.adopt(views, 'watch-list');
              return;
            }
            default:
              break; // ERROR, below
          }
        }
        switch (type) {
          case 'ADDED':
          case 'MODIFIED':
            this.cache.upsert(object);
            break;
          case 'DELETED':
            this.cache.remove(object);
            break;
          case 'BOOKMARK':
            break;
          case 'ERROR':
            failure = object.code === 410
              ? new GoneError(object.message ?? 'watch answered 410 Gone')
              : new Error(`watch ERROR event: ${object.message ?? 'no message'} (code ${object.code ?? '?'})`);
            abort();
            return;
          default:
            return;
        }
        events += 1;
        this.rv = object.metadata?.resourceVersion || this.rv;
      };

      const onDone = (err: unknown) => {
        clearTimeout(watchdog);
        clearTimeout(initialTimer);
        this.watching = false;
        this.abortWatch = undefined;
        const status = (err as { statusCode?: unknown } | undefined)?.statusCode;
        if (failure) reject(failure);
        // a server without watch-list refuses its parameters (422: the gate is off)
        else if (listing && (status === 422 || status === 400)) reject(new WatchListRefused(`HTTP ${status}: ${(err as Error).message}`));
        else if (err && !abortRequested) reject(err);
        // a stream that ended before its end bookmark: a server that ignored
        // sendInitialEvents never sends one, so list instead
        else if (initial && initial.size > 0 && !abortRequested) reject(new WatchListRefused(`the watch ended after ${initial.size} initial pods without the ${INITIAL_EVENTS_END} bookmark`));
        else resolve(events);
      };

      const timeoutSeconds = this.watchTimeoutSeconds ?? 300 + Math.floor(Math.random() * 300);
      // The server ends the watch after timeoutSeconds; one still open well
      // past that sits on a dead connection (node-fetch has no read timeout).
      const watchdog = setTimeout(() => {
        this.log.warn({ timeoutSeconds }, 'pod watch outlived its server-side timeout; reconnecting');
        abort();
      }, (timeoutSeconds + Math.min(30, timeoutSeconds)) * 1000);
      const initialTimer = listing
        ? setTimeout(() => {
          if (!initial) return;
          failure = new WatchListRefused(`no ${INITIAL_EVENTS_END} bookmark within ${this.initialEventsTimeoutMs} ms (${initial.size} initial pods so far)`);
          abort();
        }, this.initialEventsTimeoutMs)
        : undefined;
      new Watch(this.kc)
        .watch('/api/v1/pods', {
          ...(listing ? { sendInitialEvents: true, resourceVersionMatch: 'NotOlderThan' } : { resourceVersion: this.rv }),
          allowWatchBookmarks: true,
          fieldSelector: this.fieldSelector,
          timeoutSeconds,
        }, onEvent, onDone)
        .then((c) => {
          controller = c;
          if (abortRequested) {
            c.abort();
          } else if (!c.signal.aborted) {
            this.watching = true;
            this.watchEstablishedAt = Date.now();
            if (this.lastError) this.log.info({ resourceVersion: this.rv }, 'pod watch re-established');
            this.lastError = undefined;
          }
        }, (err: unknown) => onDone(err));
    });
  }

  /** Sleeps for about `ms` (with jitter, cut short by stop()); returns the next backoff. */
  private async pause(ms: number): Promise<number> {
    const jittered = Math.round(ms * (0.8 + Math.random() * 0.4));
    await new Promise<void>((resolve) => {
      const t = setTimeout(resolve, jittered);
      this.wakeSleep = () => {
        clearTimeout(t);
        resolve();
      };
    });
    this.wakeSleep = undefined;
    return Math.min(ms * 2, this.maxBackoffMs);
  }
}

const podPath = (namespace: string, name: string) => `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods/${encodeURIComponent(name)}`;

function describe(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const e = err as { code?: unknown; statusCode?: unknown; cause?: { code?: string } };
  const status = typeof e.statusCode === 'number' ? e.statusCode : typeof e.code === 'number' ? e.code : undefined;
  const parts = [err.message.split('\n')[0] ?? err.message];
  // a KubeApiError's message names its status already
  if (status !== undefined && !(err instanceof KubeApiError)) parts.push(`(HTTP ${status})`);
  if (e.cause?.code) parts.push(`[${e.cause.code}]`);
  if (status === 401) parts.push('- the credentials were rejected; check the kubeconfig or service account token');
  if (status === 403) parts.push('- the service account needs list and watch on pods (ClusterRole)');
  return parts.join(' ');
}
