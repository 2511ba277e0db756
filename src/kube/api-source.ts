// Pods of this node from the Kubernetes API: LIST, then WATCH from the list's
// resourceVersion with bookmarks, the reflector protocol client-go uses.
//
// Built on client-node's Watch (the streaming primitive) and CoreV1Api rather
// than its ListWatch/makeInformer, because ListWatch cannot ask for bookmarks,
// stops for good on any non-410 error, and has no backoff: a node agent must
// ride out API server restarts on its own.
import { existsSync, readFileSync } from 'node:fs';
import { dirname, isAbsolute, resolve } from 'node:path';
import { CoreV1Api, KubeConfig, Watch, type User, type V1Pod } from '@kubernetes/client-node';
import { parse as parseYaml } from 'yaml';
import { pino, type Logger } from 'pino';
import { CachedPodSource } from './pod-cache.js';
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

class GoneError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'GoneError';
  }
}

export class ApiSource extends CachedPodSource implements PodSource {
  private readonly kc: KubeConfig;
  private readonly api: CoreV1Api;
  private readonly nodeName: string;
  private readonly log: Logger;
  private readonly minBackoffMs: number;
  private readonly maxBackoffMs: number;
  private readonly watchTimeoutSeconds: number | undefined;
  private readonly listPageSize: number;
  private rv = '';
  private isSynced = false;
  private watching = false;
  private lastError: string | undefined;
  private loop: Promise<void> | undefined;
  private abortWatch: (() => void) | undefined;
  private watchEstablishedAt: number | undefined;
  private wakeSleep: (() => void) | undefined;
  private syncWaiters: { resolve(): void; reject(err: Error): void }[] = [];

  constructor(opts: ApiSourceOptions) {
    super();
    if (!opts.nodeName) throw new Error('ApiSource needs the node name (set NODE_NAME from spec.nodeName)');
    this.kc = opts.kubeConfig;
    this.api = this.kc.makeApiClient(CoreV1Api);
    this.nodeName = opts.nodeName;
    this.log = (opts.logger ?? pino({ name: 'meshcap' })).child({ component: 'pod-watch', node: opts.nodeName });
    this.minBackoffMs = opts.minBackoffMs ?? 200;
    this.maxBackoffMs = opts.maxBackoffMs ?? 30_000;
    this.watchTimeoutSeconds = opts.watchTimeoutSeconds;
    this.listPageSize = opts.listPageSize ?? LIST_PAGE;
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
    await this.api.createNamespacedEvent({
      namespace,
      body: {
        metadata: { generateName: `${name}.`, namespace },
        involvedObject: { apiVersion: 'v1', kind: 'Pod', namespace, name, ...(uid ? { uid } : {}) },
        reason,
        message,
        type,
        source: { component: 'meshcap-agent', host: this.nodeName },
        reportingComponent: 'meshcap-agent',
        reportingInstance: this.nodeName,
        firstTimestamp: now,
        lastTimestamp: now,
        count: 1,
      },
    });
  }

  /** Repair's --repair=label (needs pods patch). */
  async labelPod(namespace: string, name: string, labels: Record<string, string>): Promise<void> {
    const { setHeaderOptions, PatchStrategy } = await import('@kubernetes/client-node');
    await this.api.patchNamespacedPod({ namespace, name, body: { metadata: { labels } } }, setHeaderOptions('Content-Type', PatchStrategy.MergePatch));
  }

  /** Repair's --repair=delete (needs pods delete); the UID precondition never deletes a newer pod of the same name. */
  async deletePod(namespace: string, name: string, uid?: string): Promise<void> {
    await this.api.deleteNamespacedPod({ namespace, name, ...(uid ? { body: { preconditions: { uid } } } : {}) });
  }

  async stop(): Promise<void> {
    this.stopped = true;
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
        if (!this.rv) await this.relist();
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

  private async relist(): Promise<void> {
    // The first LIST may come from the API server's watch cache ("0"); after a
    // 410 ask for a consistent read, or we could go back in time.
    const resourceVersion = this.isSynced ? undefined : '0';
    // In pages of listPageSize pods, each cut to its compact view before the next
    // is asked for: the whole objects of a 10,000-pod node never sit in memory
    // at once. (A server answering from its watch cache may ignore the limit
    // and send everything in one page; that is correct too.)
    const views: V1Pod[] = [];
    let cont: string | undefined;
    let rv = '';
    do {
      let page;
      try {
        page = await this.api.listPodForAllNamespaces({
          fieldSelector: this.fieldSelector,
          limit: this.listPageSize,
          ...(cont ? { _continue: cont } : { resourceVersion }),
        });
      } catch (err) {
        // an expired continue token is a 410 too: start over with a fresh list
        if ((err as { code?: number }).code === 410) throw new GoneError('LIST answered 410 Gone');
        throw err;
      }
      if (this.stopped) return;
      for (const pod of page.items) views.push(this.cache.view(pod));
      rv = page.metadata?.resourceVersion ?? '';
      cont = page.metadata?._continue || undefined;
    } while (cont);
    this.cache.replaceAll(views);
    this.rv = rv;
    if (!this.rv) throw new Error('pod LIST returned no resourceVersion');
    if (!this.isSynced) {
      this.isSynced = true;
      this.log.info({ pods: views.length, resourceVersion: this.rv }, 'pods of this node listed');
      for (const w of this.syncWaiters.splice(0)) w.resolve();
    }
  }

  /** One watch request; resolves with the number of events when it ends normally. */
  private watchOnce(): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      let events = 0;
      let failure: Error | undefined;
      let controller: AbortController | undefined;
      let abortRequested = false;
      const abort = () => {
        abortRequested = true;
        controller?.abort();
      };
      this.abortWatch = abort;

      const onEvent = (type: string, obj: unknown) => {
        if (abortRequested) return;
        const object = obj as V1Pod & { code?: number; message?: string };
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
        this.watching = false;
        this.abortWatch = undefined;
        if (failure) reject(failure);
        else if (err && !abortRequested) reject(err);
        else resolve(events);
      };

      const timeoutSeconds = this.watchTimeoutSeconds ?? 300 + Math.floor(Math.random() * 300);
      // The server ends the watch after timeoutSeconds; one still open well
      // past that sits on a dead connection (node-fetch has no read timeout).
      const watchdog = setTimeout(() => {
        this.log.warn({ timeoutSeconds }, 'pod watch outlived its server-side timeout; reconnecting');
        abort();
      }, (timeoutSeconds + Math.min(30, timeoutSeconds)) * 1000);
      new Watch(this.kc)
        .watch('/api/v1/pods', {
          resourceVersion: this.rv,
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

function describe(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const e = err as { code?: unknown; statusCode?: unknown; cause?: { code?: string } };
  const status = typeof e.statusCode === 'number' ? e.statusCode : typeof e.code === 'number' ? e.code : undefined;
  const parts = [err.message.split('\n')[0] ?? err.message];
  if (status !== undefined) parts.push(`(HTTP ${status})`);
  if (e.cause?.code) parts.push(`[${e.cause.code}]`);
  if (status === 401) parts.push('- the credentials were rejected; check the kubeconfig or service account token');
  if (status === 403) parts.push('- the service account needs list and watch on pods (ClusterRole)');
  return parts.join(' ');
}
