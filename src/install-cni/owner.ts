// On SIGTERM, install-cni must tell "meshcap is being removed from the
// cluster" (take the entry and the binary out, or every new pod on the node
// fails its CNI ADD against an agent that will never come back) from "this pod
// is being replaced" (rolling update, node drain, eviction, node reboot: leave
// everything in place, so no pod starts uncaptured while the new agent comes
// up; the new install-cni finds the entry already there).
//
// The only party that knows is the API server: the DaemonSet that owns this
// pod is gone (404: `kubectl delete`, `helm uninstall`, namespace deletion, all
// with background propagation) or carries a deletionTimestamp (foreground
// propagation). Anything else, including an API server that cannot be reached,
// keeps the entry: a stale entry fails pods loudly (ADD code 11) and the
// uninstall Job removes it, whereas a wrong removal would let pods start
// unredirected during an upgrade (repair would then catch them, late).
//
// Asking only at SIGTERM is too late for a whole-release delete: `helm
// uninstall` and `kubectl delete -f` (or the namespace's deletion) remove the
// Role and the ServiceAccount right after the DaemonSet, so by the time the
// pod is terminated its GET answers 401/403. So install-cni also WATCHES its
// DaemonSet from start-up (DaemonSetWatch): an open watch keeps delivering
// events after the RBAC objects are gone (authorization is checked when the
// request starts), and the DELETED event arrives before the pod is killed.
import type { KubeConfig } from '@kubernetes/client-node';
import type { Logger } from 'pino';

export type OwnerVerdict =
  | { remove: true; why: string }
  | { remove: false; why: string };

/** The verdict from what the API answered (pure). */
export function ownerVerdict(answer: { status: 'found'; deletionTimestamp?: unknown } | { status: 'not-found' } | { status: 'error'; message: string }, ds: string): OwnerVerdict {
  if (answer.status === 'not-found') return { remove: true, why: `DaemonSet ${ds} no longer exists: meshcap is being uninstalled` };
  if (answer.status === 'error') return { remove: false, why: `cannot read DaemonSet ${ds} (${answer.message}): leaving the CNI entry in place (run the uninstall Job to remove it)` };
  if (answer.deletionTimestamp) return { remove: true, why: `DaemonSet ${ds} is being deleted (deletionTimestamp ${String(answer.deletionTimestamp)})` };
  return { remove: false, why: `DaemonSet ${ds} still exists: a rollout, drain or restart; the CNI entry and binary stay for the next pod` };
}

/** Asks the API server about the DaemonSet `namespace/name` (a 5 s bound: SIGTERM's grace period is short). */
export async function daemonSetVerdict(kc: KubeConfig, namespace: string, name: string, timeoutMs = 5000): Promise<OwnerVerdict> {
  const { kubeRequest } = await import('../kube/rest.js');
  const ds = `${namespace}/${name}`;
  const timeout = new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`no answer in ${timeoutMs} ms`)), timeoutMs).unref());
  try {
    const obj = await Promise.race([kubeRequest<{ metadata?: { deletionTimestamp?: string } }>(kc, `/apis/apps/v1/namespaces/${encodeURIComponent(namespace)}/daemonsets/${encodeURIComponent(name)}`), timeout]);
    return ownerVerdict({ status: 'found', deletionTimestamp: obj.metadata?.deletionTimestamp }, ds);
  } catch (err) {
    const e = err as { code?: unknown; message?: string };
    if (e.code === 404) return ownerVerdict({ status: 'not-found' }, ds);
    // kubeRequest's errors name the request and the HTTP status or network error
    return ownerVerdict({ status: 'error', message: (e.message ?? String(err)).split('\n')[0]! }, ds);
  }
}

/** What the watch last saw of the DaemonSet. */
export type SeenState = 'unknown' | 'present' | 'deleting' | 'deleted';

/**
 * Follows one DaemonSet (watch with fieldSelector metadata.name, which RBAC
 * resourceNames allow), reconnecting after a second when the watch ends.
 */
export class DaemonSetWatch {
  state: SeenState = 'unknown';
  private abort: (() => void) | undefined;
  private stopped = false;
  private retry: NodeJS.Timeout | undefined;

  constructor(private readonly kc: KubeConfig, readonly namespace: string, readonly name: string, private readonly log: Logger) {}

  async start(): Promise<void> {
    if (this.stopped) return;
    const { Watch } = await import('../kube/client-node.js');
    const again = () => {
      if (this.stopped) return;
      this.retry = setTimeout(() => void this.start(), 1000);
      this.retry.unref();
    };
    try {
      const ctl = await new Watch(this.kc).watch(`/apis/apps/v1/namespaces/${this.namespace}/daemonsets`, { fieldSelector: `metadata.name=${this.name}` }, (type, obj: { metadata?: { deletionTimestamp?: unknown } }) => {
        const before = this.state;
        if (type === 'DELETED') this.state = 'deleted';
        else if (type === 'ADDED' || type === 'MODIFIED') this.state = obj.metadata?.deletionTimestamp ? 'deleting' : 'present';
        if (this.state !== before) this.log.info({ daemonSet: `${this.namespace}/${this.name}`, state: this.state }, 'own DaemonSet');
      }, (err: unknown) => {
        if (err && !this.stopped) this.log.debug({ err: (err as Error).message }, 'DaemonSet watch ended');
        again();
      });
      this.abort = () => ctl.abort();
    } catch (err) {
      this.log.warn({ daemonSet: `${this.namespace}/${this.name}`, err: (err as Error).message }, 'cannot watch own DaemonSet; will ask again on SIGTERM');
      again();
    }
  }

  stop(): void {
    this.stopped = true;
    if (this.retry) clearTimeout(this.retry);
    this.abort?.();
  }
}

/** The SIGTERM verdict: the watch's last word if it saw the DaemonSet go, else a fresh GET. */
export async function terminationVerdict(kc: KubeConfig, namespace: string, name: string, watch?: DaemonSetWatch): Promise<OwnerVerdict> {
  const ds = `${namespace}/${name}`;
  if (watch?.state === 'deleted') return { remove: true, why: `DaemonSet ${ds} was deleted (seen by the watch): meshcap is being uninstalled` };
  if (watch?.state === 'deleting') return { remove: true, why: `DaemonSet ${ds} is being deleted (seen by the watch)` };
  return daemonSetVerdict(kc, namespace, name);
}
