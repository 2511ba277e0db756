// Makes the kernel match the agent's records. A record says a pod must be
// captured; if the datapath lost it (maps recreated by an upgrade, uninstall
// then load, bpffs remounted, rules flushed in the pod netns) the pod's
// traffic silently bypasses its sidecar. So on every start, and periodically
// after (the self-check), each record whose netns still lives is checked with
// CHECK's logic and restored where it differs; what cannot be restored is
// reported loudly (error log naming the pod, metric, pod Event), never left
// silent. Records whose netns is gone are dropped.
import { existsSync } from 'node:fs';
import type { Logger } from 'pino';
import { NODE_OBJECTS, pinLayout } from '../loader/manifest.js';
import type { Mode } from '../loader/mode.js';
import type { KeySnapshot } from '../maps/registry.js';
import type { PodTarget } from '../pod-datapath/backend.js';
import type { EbpfBackend } from '../pod-datapath/ebpf.js';
import { netnsProcesses, type NetnsProcesses } from '../pod-datapath/ebpf-listeners.js';
import { ListenerIndex } from '../pod-datapath/listener-index.js';
import type { PodDatapath } from '../pod-datapath/pod-datapath.js';
import { netnsState } from '../pod-netns.js';
import { targetOf } from './handlers.js';
import type { KeyedLock } from './keyed-lock.js';
import { configOf, cookieOf, type AttachmentRecord, type StateStore } from './state-store.js';

/** Why a reconcile runs (a metric label and a log field). */
export type ReconcileTrigger = 'start' | 'self-check' | 'load';

export interface PodProblemReporter {
  /** A pod Event in a cluster (best effort: a failure to report is logged, not thrown). */
  podProblem(namespace: string, name: string, reason: string, message: string): Promise<void>;
}

export interface ReconcileDeps {
  store: StateStore;
  datapath: PodDatapath;
  nodeMode: Mode;
  /** The handlers' per-container lock: a restore never races an ADD or DEL of the same pod. */
  lock: KeyedLock;
  removeAttachment(rec: AttachmentRecord): Promise<void>;
  logger: Logger;
  reporter?: PodProblemReporter;
  /** Counts for the metrics: once per outcome at the pass's end, n pods each. */
  onOutcome?(o: PodOutcome['outcome'], trigger: ReconcileTrigger, n: number): void;
}

export interface PodOutcome {
  pod: string;
  containerId: string;
  outcome: 'ok' | 'restored' | 'dropped' | 'failed';
  /** What differed (restored) or why it failed. */
  detail?: string[];
  /** Inbound listeners of a running proxy put back into mc_listen. */
  listeners?: number;
  /**
   * failed, and all that failed was the proxy's listener (mc_listen): its
   * captured inbound connections are refused, none goes around the proxy.
   */
  refused?: true;
}

/** What a failed pod's traffic does until it is fixed, for its log line, Event and `meshcap load`'s output. */
export const failedTrafficText = (out: PodOutcome) =>
  out.refused ? "its captured inbound connections are refused (none bypasses the sidecar)" : 'its traffic may bypass the sidecar';

export interface ReconcileReport {
  trigger: ReconcileTrigger;
  records: number;
  ok: number;
  restored: number;
  dropped: number;
  failed: number;
  /** Inbound listeners of running proxies put back into mc_listen. */
  listenersRegistered: number;
  orphansSwept: number;
  /** Destination slots of netns that are no longer pods, swept with the orphans. */
  slotsSwept: number;
  ms: number;
  /**
   * The pods that were not ok (restored, dropped, failed). The ok ones are
   * only counted: a pass over 10,000 pods kept an outcome each to its end,
   * and so moved them into V8's old space every 30 s (docs/bench-scale.md).
   */
  pods: PodOutcome[];
}

/** What is missing of the node-wide eBPF datapath (empty: every link pinned and the maps are the pinned ones). */
export function nodeDatapathProblems(pinRoot: string, ebpf: EbpfBackend): string[] {
  const L = pinLayout(pinRoot);
  const problems: string[] = [];
  // Optional objects are not required: a kernel that refused one has no link
  // for it, and that must not read as a lost datapath on every pass.
  for (const spec of NODE_OBJECTS.filter((o) => !o.optional)) {
    for (const cp of spec.cgroup) if (!existsSync(L.link(cp.name))) problems.push(`link ${cp.name} is not pinned at ${L.link(cp.name)}`);
  }
  if (!ebpf.matchesPins()) problems.push(`the maps pinned under ${L.maps} are not the ones the agent holds (removed or recreated)`);
  return problems;
}

/** Pods between two turns of the event loop in a pass. */
const YIELD_EVERY = 64;

/** Pods per native liveness call at the start of a pass (bounds its per-pod arrays and strings). */
const LIVENESS_BATCH = 1024;

/** Pods reconciled at once. */
export const RECONCILE_CONCURRENCY = 4;
const OUTCOMES = ['ok', 'restored', 'dropped', 'failed'] as const;

const podName = (r: AttachmentRecord) => `${r.podNamespace}/${r.podName}`;
const causeOf = (err: unknown) => (err instanceof Error ? err.message : String(err));

/**
 * One pass over every record. Runs each pod under the handlers' lock, so it
 * may run while the CNI socket serves. Orphan map entries (a pod in the maps
 * with no record) are swept only with `sweepOrphans`, i.e. before the socket
 * serves: during an ADD the map is written before the record.
 */
export async function reconcilePods(
  d: ReconcileDeps,
  trigger: ReconcileTrigger,
  opts: { sweepOrphans?: boolean; skipIptables?: boolean; concurrency?: number } = {},
): Promise<ReconcileReport> {
  const t0 = performance.now();
  const log = d.logger.child({ component: 'reconcile' });
  const report: ReconcileReport = { trigger, records: 0, ok: 0, restored: 0, dropped: 0, failed: 0, listenersRegistered: 0, orphansSwept: 0, slotsSwept: 0, ms: 0, pods: [] };
  // One /proc scan for all pods, made lazily: only a missing listener asks for it.
  let procs: NetnsProcesses | undefined;
  const processes = () => (procs ??= netnsProcesses());
  // The per-pod maps read whole once for the pass (see KeySnapshot).
  let snap: KeySnapshot | undefined;
  let listening: ListenerIndex | undefined;
  const pass: PassState = {
    processes,
    snapshot: () => {
      const ebpf = d.datapath.ebpf;
      if (!ebpf) return undefined;
      return (snap ??= ebpf.snapshot());
    },
    listening: () => (listening ??= d.datapath.ebpf?.listenerSnapshot() ?? new ListenerIndex()),
  };

  // iptables pods cost an iptables-save in their netns each: the self-check
  // visits them less often than eBPF pods (see the agent).
  const records = d.store.list().filter((r) => !(opts.skipIptables && r.mode === 'iptables'));
  report.records = records.length;
  // Every eBPF pod's netns shown live by its pinned link, LIVENESS_BATCH pods
  // per native call (per pod it was four syscalls through N-API each). A pod
  // not shown here, or whose record changed since, is looked at on its own
  // below. A flag per record, not a key string per pod held for the pass.
  const shownAtStart = new Uint8Array(records.length);
  const ebpfAtStart = d.datapath.ebpf;
  if (ebpfAtStart) {
    let batch: number[] = [];
    const flush = () => {
      if (batch.length === 0) return;
      const shown = ebpfAtStart.netnsShownLiveMany(batch.map((i) => ({ netnsPath: records[i]!.netns, netns: cookieOf(records[i]!)! })), pass.snapshot());
      batch.forEach((i, k) => {
        if (shown[k]) shownAtStart[i] = 1;
      });
      batch = [];
    };
    records.forEach((r, i) => {
      if (r.mode !== 'ebpf' || r.netnsCookie === null) return;
      batch.push(i);
      if (batch.length === LIVENESS_BATCH) flush();
    });
    flush();
  }
  // shown at the start only if the record still names the netns the link showed
  const shownNow = (at: number, rec: AttachmentRecord) => shownAtStart[at] === 1 && rec.netnsCookie === records[at]!.netnsCookie && rec.netns === records[at]!.netns;
  /** Counts and logs a pod's outcome; a failed one is also a pod Event (the promise). */
  const count = (out: PodOutcome, first: AttachmentRecord): Promise<void> | undefined => {
    report[out.outcome]++;
    report.listenersRegistered += out.listeners ?? 0;
    if (out.outcome === 'ok') return undefined;
    report.pods.push(out);
    const pod = out.pod;
    if (out.outcome === 'restored') log.warn({ pod, containerId: out.containerId, trigger, drift: out.detail }, 'datapath differed from the record: pod restored');
    else if (out.outcome === 'dropped') log.info({ pod, containerId: out.containerId, trigger, reason: out.detail?.[0] }, 'record dropped: its netns is gone');
    else if (out.outcome === 'failed') {
      const traffic = failedTrafficText(out);
      const msg = `meshcap cannot restore the ${first.mode} redirect of pod ${pod}: ${out.detail?.join('; ')}. Until this is fixed ${traffic} (see meshcap status).`;
      log.error({ pod, containerId: out.containerId, netns: first.netns, trigger, problems: out.detail }, `pod NOT restored: ${traffic}`);
      return d.reporter?.podProblem(first.podNamespace, first.podName, 'MeshcapRedirectLost', msg).catch((err: unknown) => {
        log.warn({ pod, err: causeOf(err) }, 'cannot post a pod event');
      });
    }
    return undefined;
  };
  // Nearly every pod of a pass: an eBPF pod that no ADD or DEL holds, whose
  // check needs no await. Checked at once, outside the lock: nothing can
  // interleave with synchronous code, and no ADD or DEL of it is under way.
  // Spared per pod: the lock's Map (a set and a delete: a long-lived Map's
  // rehashed tables land in V8's old space), its promises and its outcome.
  // With repair's lighter index, a 10,000-pod pass moves 3.9 MB (sampled)
  // into old space instead of 10.5 (docs/bench-scale.md).
  // false: the pod needs one() (nothing done yet).
  const now = (at: number): boolean => {
    const first = records[at]!;
    if (d.lock.holds(first.containerId)) return false;
    const rec = d.store.get(first.containerId, first.ifname);
    if (!rec) return true; // removed since the pass began: as under the lock
    const out = checkEbpfPodNow(d, rec, pass, shownNow(at, rec));
    if (out === undefined) return false;
    if (out === 'ok') report.ok++;
    else void count(out, first); // restored (a listener put back): no Event
    return true;
  };
  const one = async (at: number): Promise<void> => {
    const first = records[at]!;
    const out = await d.lock.run(first.containerId, async (): Promise<PodOutcome | null> => {
      // Re-read under the lock: an ADD or DEL may have changed it meanwhile.
      const rec = d.store.get(first.containerId, first.ifname);
      if (!rec) return null;
      return reconcileOne(d, rec, pass, trigger, shownNow(at, rec));
    });
    if (out) await count(out, first);
  };
  // A few pods at a time: iptables pods wait on iptables-save/-restore
  // processes, so overlapping them shortens a node's uncaptured window.
  let next = 0;
  const worker = async () => {
    while (next < records.length) {
      const at = next++;
      if (!now(at)) await one(at);
      // A pass over eBPF pods is synchronous or awaits only settled promises
      // (microtasks): it lets the CNI socket's I/O in every YIELD_EVERY pods,
      // so a self-check over 10,000 pods does not hold ADDs for its whole length.
      if (next % YIELD_EVERY === 0) await new Promise<void>((r) => setImmediate(r));
    }
  };
  await Promise.all(Array.from({ length: Math.min(opts.concurrency ?? RECONCILE_CONCURRENCY, records.length) }, worker));

  // Once per pass, not per pod: a labelled counter hashes its labels per
  // call (2 MB of a 10,000-pod pass's garbage, docs/bench-scale.md).
  for (const o of OUTCOMES) if (report[o] > 0) d.onOutcome?.(o, trigger, report[o]);

  const ebpf = d.datapath.ebpf;
  if (opts.sweepOrphans && ebpf) {
    const owned = new Set(d.store.list().filter((r) => r.mode === 'ebpf').map((r) => cookieOf(r)));
    for (const cookie of ebpf.pods()) {
      if (owned.has(cookie)) continue;
      ebpf.remove(cookie);
      report.orphansSwept++;
    }
  }
  // Destination slots of removed pods whose netns is gone (every pass), and
  // at the start of every netns that is no pod (sweepSlots).
  if (ebpf) report.slotsSwept = await ebpf.sweepSlots({ all: opts.sweepOrphans === true });
  report.ms = Math.round(performance.now() - t0);
  return report;
}

interface PassState {
  processes(): NetnsProcesses;
  snapshot(): KeySnapshot | undefined;
  /** mc_listen's pods and families, one walk per pass (see refillPodListeners). */
  listening(): ListenerIndex;
}

/**
 * An eBPF pod on an eBPF node checked without an await: 'ok'; its outcome
 * when all that differed was its proxy's inbound listener (put back); or
 * undefined when it needs reconcileOne, which nothing here has started: its
 * netns not shown by its link, its map entries differ, an error.
 */
function checkEbpfPodNow(d: ReconcileDeps, rec: AttachmentRecord, pass: PassState, shownAtStart: boolean): 'ok' | PodOutcome | undefined {
  const ebpf = d.datapath.ebpf;
  const cookie = cookieOf(rec);
  if (rec.mode !== 'ebpf' || d.nodeMode !== 'ebpf' || !ebpf || cookie === null) return undefined;
  const snap = pass.snapshot();
  if (!shownAtStart && !ebpf.netnsShownLive(rec.netns, cookie, snap)) return undefined;
  const cfg = configOf(rec);
  try {
    if (ebpf.checkEntries(cookie, cfg, rec.podIPs, snap).length > 0) return undefined;
    if (!cfg.parsed.inboundCapture) return 'ok';
    const r = refillPodListener(ebpf, rec, cookie, cfg, pass);
    if (r.registered.length === 0) return 'ok';
    return { pod: podName(rec), containerId: rec.containerId, outcome: 'restored', detail: [listenerDrift(r.registered)], listeners: r.registered.length };
  } catch {
    return undefined; // reconcileOne tries again, and reports what fails
  }
}

/** The pod's proxy's inbound listener put back into mc_listen where a running proxy has one (both paths of a pass). */
const refillPodListener = (ebpf: EbpfBackend, rec: AttachmentRecord, cookie: bigint, cfg: ReturnType<typeof configOf>, pass: PassState) =>
  ebpf.refillListeners({ netns: cookie, netnsPath: rec.netns, port: Number(cfg.inboundCapturePort), processes: pass.processes, listening: pass.listening() });

const listenerDrift = (families: readonly number[]) => `inbound listener not registered (IPv${families.join('/IPv')})`;

/** shownAtStart: the pod's pinned link showed its recorded netns live at the start of the pass. */
async function reconcileOne(d: ReconcileDeps, rec: AttachmentRecord, pass: PassState, trigger: ReconcileTrigger, shownAtStart: boolean): Promise<PodOutcome> {
  const base = { pod: podName(rec), containerId: rec.containerId };
  const cookie = cookieOf(rec);
  const snap = rec.mode === 'ebpf' ? pass.snapshot() : undefined;
  // A pod's pinned link shows its netns live without a setns (most eBPF pods).
  const shown = rec.mode === 'ebpf' && cookie !== null && (shownAtStart || d.datapath.ebpf?.netnsShownLive(rec.netns, cookie, snap) === true);
  const ns = shown ? 'live' : await netnsState(rec.netns, cookie);
  if (ns !== 'live') {
    // The pod is gone (its DEL went unanswered) or the path names another netns now.
    if (trigger === 'load') return { ...base, outcome: 'ok', detail: [`netns ${ns}: left for the agent`] };
    try {
      await d.removeAttachment(rec);
      return { ...base, outcome: 'dropped', detail: [`netns ${rec.netns} ${ns}`] };
    } catch (err) {
      return { ...base, outcome: 'failed', detail: [causeOf(err)] };
    }
  }

  // A pod recorded in eBPF mode on a node that now runs iptables mode is kept
  // captured the only way this node can: istio-iptables rules in its netns.
  if (rec.mode === 'ebpf' && d.nodeMode === 'iptables') {
    if (trigger === 'load') return { ...base, outcome: 'ok', detail: ['node runs iptables mode: left for the agent'] };
    try {
      const target: PodTarget = { ...targetOf(rec), mode: 'iptables' };
      const newCookie = await d.datapath.register(target);
      await d.store.put({
        ...rec,
        mode: 'iptables',
        netnsCookie: newCookie === null ? rec.netnsCookie : newCookie.toString(),
        modeReason: 'recorded in eBPF mode, restored in iptables mode: the node runs iptables mode now',
      });
      return { ...base, outcome: 'restored', detail: ['eBPF datapath absent on this node: moved to iptables mode'] };
    } catch (err) {
      return { ...base, outcome: 'failed', detail: [`cannot move the pod to iptables mode: ${causeOf(err)}`] };
    }
  }
  if (rec.mode === 'iptables' && trigger === 'load') return { ...base, outcome: 'ok' };

  const target = targetOf(rec);
  let drift: string[];
  try {
    // The netns was just found live and the recorded one: for an eBPF pod what
    // CHECK adds is its entries (datapath.check would look the netns up again,
    // a setns on a helper thread per pod: half of a 10,000-pod start-up).
    const ebpfNow = d.datapath.ebpf;
    drift = rec.mode === 'ebpf' && ebpfNow && cookie !== null
      ? ebpfNow.checkEntries(cookie, target.config, target.podIPs, snap)
      : await d.datapath.check(target, cookie, snap);
    if (drift.length > 0 && snap && ebpfNow && cookie !== null) {
      // The snapshot may predate an ADD of this pod during the pass: its
      // mc_pods/mc_stats entries are read again before calling it drift.
      ebpfNow.refreshSnapshot(snap, cookie, 'values');
      drift = ebpfNow.checkEntries(cookie, target.config, target.podIPs, snap);
    }
    if (drift.length > 0) {
      await d.datapath.register(target);
      if (snap && cookie !== null) d.datapath.ebpf?.refreshSnapshot(snap, cookie);
      const still = await d.datapath.check(target, cookie, snap);
      if (still.length > 0) return { ...base, outcome: 'failed', detail: still };
    }
  } catch (err) {
    return { ...base, outcome: 'failed', detail: [causeOf(err)] };
  }

  // The proxy's inbound listener: sockops registers it at listen(); a map
  // recreated under a running proxy has lost it.
  let listeners = 0;
  const cfg = configOf(rec);
  const ebpf = d.datapath.ebpf;
  if (rec.mode === 'ebpf' && ebpf && cookie !== null && cfg.parsed.inboundCapture) {
    try {
      const r = refillPodListener(ebpf, rec, cookie, cfg, pass);
      listeners = r.registered.length;
      if (listeners > 0) drift.push(listenerDrift(r.registered));
    } catch (err) {
      // with its entries in place (drift empty or repaired) only inbound is lost, and it fails closed
      return { ...base, outcome: 'failed', detail: [...drift, `cannot register the proxy's inbound listener: ${causeOf(err)}`], refused: true };
    }
  }
  if (drift.length === 0) return { ...base, outcome: 'ok' };
  return { ...base, outcome: 'restored', detail: drift, listeners };
}
