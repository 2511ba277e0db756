// Prometheus metrics of the agent (prom-client, its own registry). Counters
// of redirected connections are read from the pinned eBPF maps at scrape time,
// so they are the datapath's numbers, not the agent's guess.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { AddOutcome, CniCommand, CniHandlers, CniRequest } from '../cni/types.js';
import type { EbpfBackend } from '../pod-datapath/ebpf.js';
import { MapFullError } from '../maps/map-full.js';
import { cookieOf, type AttachmentRecord, type StateStore } from './state-store.js';

export interface AgentMetrics {
  registry: Registry;
  /** n pod outcomes of a reconcile pass (start, self-check). */
  reconciled(outcome: 'ok' | 'restored' | 'dropped' | 'failed', trigger: string, n?: number): void;
  /** A self-check found the node-wide datapath gone and reloaded it. */
  nodeReloaded(): void;
  /** Pods whose datapath could not be restored in the last pass. */
  setUnrestored(n: number): void;
  /** A meshed pod found running without capture, and what repair did about it. */
  repaired(action: string, outcome: 'ok' | 'failed'): void;
  /** Wraps handlers so every verb is counted and timed. */
  instrument<H extends CniHandlers>(h: H): H;
}

export interface MetricsOptions {
  /**
   * Also export meshcap_pod_redirected_connections_total with namespace and
   * pod labels (one series per pod and direction: off by default, as a node
   * with thousands of pods would give Prometheus thousands of series).
   */
  perPod?: boolean;
}

const DIRECTIONS = ['outbound', 'inbound', 'own_pod', 'dns'] as const;
type Direction = (typeof DIRECTIONS)[number];

export function createMetrics(store: StateStore, ebpfNow: () => EbpfBackend | null, opts: MetricsOptions = {}): AgentMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'meshcap_agent_' });

  const requests = new Counter({
    name: 'meshcap_cni_requests_total',
    help: 'CNI requests handled, by verb and result (ok or the CNI error code)',
    labelNames: ['verb', 'result'] as const,
    registers: [registry],
  });
  const latency = new Histogram({
    name: 'meshcap_cni_request_duration_seconds',
    help: 'Time the agent took to handle a CNI request (pod wait, decision, datapath write), by verb',
    labelNames: ['verb'] as const,
    buckets: [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    registers: [registry],
  });
  new Gauge({
    name: 'meshcap_pods',
    help: 'Meshed pod attachments with a redirect in place, by datapath mode',
    labelNames: ['mode'] as const,
    registers: [registry],
    collect() {
      this.reset();
      this.set({ mode: 'ebpf' }, 0);
      this.set({ mode: 'iptables' }, 0);
      for (const r of store.list()) this.inc({ mode: r.mode });
    },
  });
  /** Each recorded eBPF pod's mc_stats counters, read at scrape time. */
  function* podCounts(): Generator<{ rec: AttachmentRecord; cookie: bigint; counts: Record<Direction | 'origdst', number> }> {
    const ebpf = ebpfNow();
    if (!ebpf) return;
    for (const rec of store.list()) {
      const cookie = cookieOf(rec);
      if (rec.mode !== 'ebpf' || cookie === null) continue;
      const s = ebpf.stats(cookie);
      if (s) yield { rec, cookie, counts: { outbound: Number(s.outbound), inbound: Number(s.inbound), own_pod: Number(s.own_pod), dns: Number(s.dns), origdst: Number(s.origdst ?? 0n) } };
    }
  }
  // The node's total: the sum of every pod's mc_stats counters, kept monotonic
  // across pods that go away (their last count stays in the total) and
  // counters that restart (a pod re-registered with fresh stats).
  const COUNTED = [...DIRECTIONS, 'origdst'] as const;
  const lastSeen = new Map<string, Record<(typeof COUNTED)[number], number>>();
  const nodeTotal: Record<(typeof COUNTED)[number], number> = { outbound: 0, inbound: 0, own_pod: 0, dns: 0, origdst: 0 };
  // one walk of the pods per scrape serves both counters below
  let refreshed = false;
  const refreshTotals = () => {
    if (refreshed) return;
    refreshed = true;
    // prom-client runs every collect() of one scrape in one synchronous span
    queueMicrotask(() => { refreshed = false; });
    const seen = new Set<string>();
    for (const { cookie, counts: now } of podCounts()) {
      const key = String(cookie);
      seen.add(key);
      const before = lastSeen.get(key);
      for (const d of COUNTED) nodeTotal[d] += before && now[d] >= before[d] ? now[d] - before[d] : now[d];
      lastSeen.set(key, now);
    }
    for (const k of [...lastSeen.keys()]) if (!seen.has(k)) lastSeen.delete(k);
  };
  new Counter({
    name: 'meshcap_redirected_connections_total',
    help: 'Connections the eBPF datapath redirected on this node, by direction (the sum over its pods, read from the pinned mc_stats map)',
    labelNames: ['direction'] as const,
    registers: [registry],
    collect() {
      refreshTotals();
      this.reset();
      for (const d of DIRECTIONS) this.inc({ direction: d }, nodeTotal[d]);
    },
  });
  // A redirected TCP connection whose proxy never got its original
  // destination (the in-flight entry evicted from the mc_origdst LRU, or the
  // connection gone before the proxy asked) shows as redirected
  // outbound+own_pod growing faster than this: the proxy's SO_ORIGINAL_DST
  // then fails (the kernel's own answer), it is never given a wrong one.
  new Counter({
    name: 'meshcap_original_dst_answered_total',
    help: 'SO_ORIGINAL_DST answers the eBPF datapath gave the proxies on this node (read from mc_stats); compare with meshcap_redirected_connections_total',
    registers: [registry],
    collect() {
      refreshTotals();
      this.reset();
      this.inc(nodeTotal.origdst);
    },
  });
  if (opts.perPod) new Counter({
    name: 'meshcap_pod_redirected_connections_total',
    help: 'Connections the eBPF datapath redirected for a pod, by direction (read from the pinned mc_stats map)',
    labelNames: ['namespace', 'pod', 'direction'] as const,
    registers: [registry],
    collect() {
      this.reset();
      for (const { rec, counts } of podCounts()) {
        for (const d of DIRECTIONS) this.inc({ namespace: rec.podNamespace, pod: rec.podName, direction: d }, counts[d]);
      }
    },
  });

  // Fill levels of the per-pod maps, read at scrape time: an ADD fails with
  // E2BIG/ENOSPC once one is full, so alert well before entries reach max.
  // (one key walk serves both gauges of a scrape)
  let filled: { at: number; v: ReturnType<EbpfBackend['fill']> } | null = null;
  const fill = () => {
    if (!filled || Date.now() - filled.at > 1000) filled = { at: Date.now(), v: ebpfNow()?.fill() ?? [] };
    return filled.v;
  };
  new Gauge({
    name: 'meshcap_bpf_map_entries',
    help: "Entries in each per-pod eBPF map (mc_pods, mc_cidrs, mc_ports, mc_portranges, mc_stats, mc_dstslot, mc_listen), read at scrape time; compare with meshcap_bpf_map_max_entries (a full mc_dstslot sends new destinations the slower way, through socket storage; a full mc_listen leaves a proxy's new listening sockets without captured inbound connections)",
    labelNames: ['map'] as const,
    registers: [registry],
    collect() {
      this.reset();
      for (const f of fill()) this.set({ map: f.map }, f.entries);
    },
  });
  new Gauge({
    name: 'meshcap_bpf_map_max_entries',
    help: 'Capacity (max_entries) of each per-pod eBPF map',
    labelNames: ['map'] as const,
    registers: [registry],
    collect() {
      this.reset();
      for (const f of fill()) this.set({ map: f.map }, f.maxEntries);
    },
  });

  const mapFull = new Counter({
    name: 'meshcap_bpf_map_full_total',
    help: 'CNI ADDs refused because an eBPF map was full (the pod was not captured and its sandbox not started), by map',
    labelNames: ['map'] as const,
    registers: [registry],
  });

  const reconciled = new Counter({
    name: 'meshcap_reconcile_pods_total',
    help: 'Pods checked against their record by a reconcile pass, by outcome (ok, restored: the datapath differed and was repaired, dropped: netns gone, failed: NOT restored) and trigger (start, self-check)',
    labelNames: ['outcome', 'trigger'] as const,
    registers: [registry],
  });
  const nodeReloads = new Counter({
    name: 'meshcap_datapath_reloads_total',
    help: 'Times the self-check found the node-wide eBPF datapath gone (unpinned or maps recreated) and loaded it again',
    registers: [registry],
  });
  const unrestored = new Gauge({
    name: 'meshcap_pods_unrestored',
    help: 'Meshed pods whose datapath differs from their record and could not be restored in the last pass: their traffic may bypass the sidecar',
    registers: [registry],
  });
  unrestored.set(0);
  const repairs = new Counter({
    name: 'meshcap_repair_pods_total',
    help: 'Meshed pods found running without capture (no CNI ADD through meshcap), by the action taken (repair: captured in place through the pod netns, label, delete) and outcome (ok, failed: the pod still bypasses its sidecar)',
    labelNames: ['action', 'outcome'] as const,
    registers: [registry],
  });

  function timed<R>(verb: CniCommand, fn: (...a: never[]) => Promise<R>) {
    return async (...args: never[]): Promise<R> => {
      const end = latency.startTimer({ verb });
      try {
        const r = await fn(...args);
        requests.inc({ verb, result: 'ok' });
        return r;
      } catch (err) {
        const code = (err as { code?: unknown }).code;
        const cause = (err as { cause?: unknown }).cause;
        if (cause instanceof MapFullError) mapFull.inc({ map: cause.map });
        requests.inc({ verb, result: typeof code === 'number' ? `error_${code}` : 'error' });
        throw err;
      } finally {
        end();
      }
    };
  }

  return {
    registry,
    reconciled: (outcome, trigger, n = 1) => reconciled.inc({ outcome, trigger }, n),
    nodeReloaded: () => nodeReloads.inc(),
    setUnrestored: (n) => unrestored.set(n),
    repaired: (action, outcome) => repairs.inc({ action, outcome }),
    instrument<H extends CniHandlers>(h: H): H {
      return {
        ...h,
        add: timed('ADD', h.add as (req: CniRequest) => Promise<AddOutcome | void>),
        del: timed('DEL', h.del as (req: CniRequest) => Promise<void>),
        check: timed('CHECK', h.check as (req: CniRequest) => Promise<void>),
        status: timed('STATUS', h.status as (req: CniRequest) => Promise<void>),
        gc: timed('GC', h.gc as never),
      };
    },
  };
}
