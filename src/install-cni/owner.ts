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
// unredirected during an upgrade, silently.
import type { KubeConfig } from '@kubernetes/client-node';

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
  const { AppsV1Api } = await import('@kubernetes/client-node');
  const api = kc.makeApiClient(AppsV1Api);
  const ds = `${namespace}/${name}`;
  const timeout = new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`no answer in ${timeoutMs} ms`)), timeoutMs).unref());
  try {
    const obj = await Promise.race([api.readNamespacedDaemonSet({ namespace, name }), timeout]);
    return ownerVerdict({ status: 'found', deletionTimestamp: obj.metadata?.deletionTimestamp }, ds);
  } catch (err) {
    const e = err as { code?: unknown; message?: string };
    if (e.code === 404) return ownerVerdict({ status: 'not-found' }, ds);
    return ownerVerdict({ status: 'error', message: `${e.code ? `HTTP ${String(e.code)}: ` : ''}${(e.message ?? String(err)).split('\n')[0]}` }, ds);
  }
}
