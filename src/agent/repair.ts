// Repair: meshed pods on this node that run WITHOUT capture. A pod that got
// its sandbox while meshcap-cni was not in the chain (created before install,
// or while the primary CNI had dropped the entry and install-cni was down) has
// an IP but no record: its traffic bypasses the sidecar, silently. Found from
// the pod watch (meshed, running, has an IP, not being deleted) against the
// agent's own records; the kernel tells where its netns is
// (pod-netns-finder.ts). Then, by --repair:
//   repair (default): set the capture up in place through the pod's netns,
//     exactly as ADD would, and record it (connections already open stay
//     uncaptured; new ones are captured);
//   label: label the pod meshcap.io/uncaptured=true for someone else to act on;
//   delete: delete the pod so its owner recreates it through the CNI chain
//     (istio-cni's repair controller's default);
//   off: nothing.
// Either way a pod Event and the meshcap_repair_pods_total metric.
// A pod with an IP had its CNI ADD answered already (kubelet writes the IP
// after ADD), and ADD records before it answers, so a pod still in its ADD is
// never taken for an uncaptured one.
import type { V1Pod } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { decideAdd } from '../decision/add.js';
import { namespaceExclusion } from '../decision/meshed.js';
import { podNamespace } from '../kube/pod-source.js';
import type { Mode } from '../loader/mode.js';
import type { PodTarget } from '../pod-datapath/backend.js';
import type { PodDatapath } from '../pod-datapath/pod-datapath.js';
import type { KeyedLock } from './keyed-lock.js';
import { netnsProcesses } from '../pod-datapath/ebpf-listeners.js';
import { findPodNetns } from './pod-netns-finder.js';
import { settingsOf, STATE_VERSION, type AttachmentRecord, type StateStore } from './state-store.js';

export const REPAIR_MODES = ['repair', 'label', 'delete', 'off'] as const;
export type RepairMode = (typeof REPAIR_MODES)[number];
export const UNCAPTURED_LABEL = 'meshcap.io/uncaptured';

/** What repair asks of the cluster (the API source implements it; standalone has none). */
export interface RepairActions {
  podEvent(namespace: string, name: string, type: 'Normal' | 'Warning', reason: string, message: string): Promise<void>;
  labelPod(namespace: string, name: string, labels: Record<string, string>): Promise<void>;
  deletePod(namespace: string, name: string, uid?: string): Promise<void>;
}

export interface RepairDeps {
  mode: RepairMode;
  pods(): V1Pod[];
  store: StateStore;
  datapath: PodDatapath;
  nodeMode: Mode;
  excludeNamespaces: readonly string[];
  lock: KeyedLock;
  logger: Logger;
  actions?: RepairActions;
  onOutcome?(action: RepairMode, outcome: 'ok' | 'failed'): void;
  /** /proc (tests give another). */
  procRoot?: string;
  /** pod UID -> when it was last acted on and failed: such a pod is retried (and reported) at most every retryMs. */
  failedAt?: Map<string, number>;
  retryMs?: number;
}

/** A pod that could not be repaired is retried (and gets another Event) at most this often. */
export const REPAIR_RETRY_MS = 60_000;

/** The UIDs of a name's records: one (nearly always) or several; null: a record without a UID. */
type RecordUids = string | null | (string | null)[];

/** Meshed pods with an IP and no record (pure): the ones running without capture. */
export function uncapturedPods(pods: readonly V1Pod[], records: readonly AttachmentRecord[], excludeNamespaces: readonly string[]): V1Pod[] {
  // A record counts for the pod with its name, unless both carry UIDs that
  // differ (a StatefulSet's earlier pod of the same name). null: a record
  // without a UID, which counts for any pod of that name. Keyed by the
  // records' own strings, namespace then name, with no array for a name's
  // only record: a "ns/name" key and an array per record were ~1.5 MiB of
  // each repair pass at 10,000 pods, all of it alive to the pass's end,
  // i.e. moved into V8's old space (docs/bench-scale.md).
  const byNs = new Map<string, Map<string, RecordUids>>();
  for (const r of records) {
    let names = byNs.get(r.podNamespace);
    if (!names) byNs.set(r.podNamespace, (names = new Map()));
    const u = r.podUid || null;
    const had = names.get(r.podName);
    names.set(r.podName, had === undefined ? u : Array.isArray(had) ? [...had, u] : [had, u]);
  }
  return pods.filter((pod) => {
    const ns = podNamespace(pod);
    const name = pod.metadata?.name ?? '';
    if (!name || pod.metadata?.deletionTimestamp) return false;
    if (pod.status?.phase !== 'Running' && pod.status?.phase !== 'Pending') return false;
    if (!pod.status?.podIP && !(pod.status?.podIPs ?? []).some((p) => p.ip)) return false;
    if (pod.metadata?.labels?.[UNCAPTURED_LABEL] === 'true') return false; // labelled already: someone else's turn
    // The record before the decision: on a settled node every pod has one,
    // and deciding a pod builds its whole capture config (at 10,000 pods
    // ~110 ms and ~11 MiB of garbage per pass, after every self-check).
    const had = byNs.get(ns)?.get(name);
    if (had !== undefined && (Array.isArray(had) ? had.some((u) => countsFor(u, pod)) : countsFor(had, pod))) return false;
    if (namespaceExclusion(ns, { excludeNamespaces })) return false;
    return decideAdd(pod, { nodeMode: 'iptables', prevResult: undefined }).kind !== 'skip';
  });
}

/** A record with this UID (null: none) counts for the pod of its name. */
function countsFor(recordUid: string | null, pod: V1Pod): boolean {
  const uid = pod.metadata?.uid;
  return recordUid === null || !uid || recordUid === uid;
}

export interface RepairOutcome {
  pod: string;
  action: RepairMode;
  outcome: 'ok' | 'failed';
  detail: string;
}

const causeOf = (err: unknown) => (err instanceof Error ? err.message : String(err));

/** One pass: every uncaptured pod gets the configured action, an Event and a metric. */
export async function repairPods(d: RepairDeps): Promise<RepairOutcome[]> {
  if (d.mode === 'off') return [];
  const log = d.logger.child({ component: 'repair' });
  const out: RepairOutcome[] = [];
  const now = Date.now();
  for (const pod of uncapturedPods(d.pods(), d.store.list(), d.excludeNamespaces)) {
    const ns = podNamespace(pod);
    const name = pod.metadata!.name!;
    const ref = `${ns}/${name}`;
    const key = pod.metadata?.uid ?? ref;
    const last = d.failedAt?.get(key);
    if (last !== undefined && now - last < (d.retryMs ?? REPAIR_RETRY_MS)) continue;
    let r: RepairOutcome;
    try {
      r = { pod: ref, action: d.mode, outcome: 'ok', detail: await act(d, pod) };
    } catch (err) {
      r = { pod: ref, action: d.mode, outcome: 'failed', detail: causeOf(err) };
    }
    out.push(r);
    if (r.outcome === 'failed') d.failedAt?.set(key, now);
    else d.failedAt?.delete(key);
    d.onOutcome?.(r.action, r.outcome);
    if (r.outcome === 'ok') log.warn({ pod: ref, action: r.action, detail: r.detail }, 'meshed pod was running without capture: repaired');
    else log.error({ pod: ref, action: r.action, err: r.detail }, 'meshed pod runs without capture and could NOT be repaired: its traffic bypasses the sidecar');
    const reason = r.outcome === 'ok' ? 'MeshcapRepaired' : 'MeshcapUncaptured';
    const message = r.outcome === 'ok'
      ? `pod ${ref} was running without meshcap capture (started while meshcap-cni was not in the node's CNI chain): ${r.detail}`
      : `pod ${ref} runs without meshcap capture and meshcap could not ${d.mode} it: ${r.detail}. Its traffic bypasses the sidecar; delete the pod to recreate it through the CNI chain.`;
    await d.actions?.podEvent(ns, name, 'Warning', reason, message).catch((err: unknown) => log.warn({ pod: ref, err: causeOf(err) }, 'cannot post a pod event'));
  }
  return out;
}

async function act(d: RepairDeps, pod: V1Pod): Promise<string> {
  const ns = podNamespace(pod);
  const name = pod.metadata!.name!;
  const uid = pod.metadata?.uid;
  if (d.mode === 'label') {
    if (!d.actions) throw new Error('no API access to label the pod (standalone agent)');
    await d.actions.labelPod(ns, name, { [UNCAPTURED_LABEL]: 'true' });
    return `labelled ${UNCAPTURED_LABEL}=true`;
  }
  if (d.mode === 'delete') {
    if (!d.actions) throw new Error('no API access to delete the pod (standalone agent)');
    await d.actions.deletePod(ns, name, uid);
    return 'deleted, so that its owner recreates it through the CNI chain';
  }
  if (!uid) throw new Error('the pod has no UID: cannot find its processes');
  const decision = decideAdd(pod, { nodeMode: d.nodeMode, prevResult: undefined });
  if (decision.kind === 'skip') throw new Error(`not meshed any more: ${decision.reason}`);
  const ipv4 = decision.podIPs.find((ip) => !ip.includes(':'));
  const found = findPodNetns(uid, { ...(d.procRoot ? { procRoot: d.procRoot } : {}), ...(ipv4 ? { ipv4 } : {}) });
  if (!found) throw new Error(`no process of pod UID ${uid} in its own network namespace on this node (cgroup paths under /proc)`);
  const containerId = found.sandboxId ?? `repair-${uid}`;
  const target: PodTarget = { mode: decision.mode, netns: found.netns, config: decision.config, podIPs: decision.podIPs };
  await d.lock.run(containerId, async () => {
    const cookie = await d.datapath.register(target);
    const rec: AttachmentRecord = {
      version: STATE_VERSION,
      containerId,
      ifname: 'eth0',
      podNamespace: ns,
      podName: name,
      podUid: uid,
      netns: found.netns,
      netnsCookie: cookie === null ? null : cookie.toString(),
      mode: decision.mode,
      modeReason: `repaired in place (no CNI ADD): ${decision.fallbackReason ?? 'the node\'s mode'}`,
      profile: decision.profile,
      settings: settingsOf(decision.config),
      podIPs: decision.podIPs,
      createdAt: new Date().toISOString(),
    };
    try {
      await d.store.put(rec);
    } catch (err) {
      await d.datapath.unregister(target, cookie).catch(() => undefined);
      throw err;
    }
    // The sidecar listened before the datapath knew the pod: sockops never
    // saw its inbound listener (reconcile.ts does the same after a reload).
    const ebpf = d.datapath.ebpf;
    if (decision.mode === 'ebpf' && ebpf && cookie !== null && decision.config.parsed.inboundCapture) {
      ebpf.refillListeners({ netns: cookie, netnsPath: found.netns, port: Number(decision.config.inboundCapturePort), processes: () => netnsProcesses(d.procRoot) });
    }
  });
  return `capture set up in place in ${found.netns} (pid ${found.pid}, ${decision.mode} mode); connections opened before now stay uncaptured`;
}
