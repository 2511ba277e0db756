// The node agent's life cycle: probe -> mode; eBPF: load (adopting pins) and
// open the pod maps; state dir; pod source synced; reconcile the records
// against the kernel (restore what the datapath lost, drop pods whose netns
// is gone); serve CNI; ready; then a periodic self-check that repairs drift.
// close() stops serving and leaves the datapath in place: traffic keeps
// flowing while the agent is down.
import { existsSync } from 'node:fs';
import path from 'node:path';
import type { Logger } from 'pino';
import { startCniServer, type CniServer } from '../cni/server.js';
import type { CniHandlers } from '../cni/types.js';
import { netConfValidator } from '../cni/netconf.js';
import type { PodSource } from '../kube/pod-source.js';
import { loadDatapath } from '../loader/datapath.js';
import { pinLayout } from '../loader/manifest.js';
import { pinnedMode, type Mode, type ModeRequest } from '../loader/mode.js';
import { MAP } from '../maps/layout.js';
import { probeKernel } from '../loader/probe.js';
import { EbpfBackend } from '../pod-datapath/ebpf.js';
import { PodDatapath } from '../pod-datapath/pod-datapath.js';
import { createAgentHandlers } from './handlers.js';
import { startHttpEndpoint, type HttpEndpoint } from './http.js';
import { KeyedLock } from './keyed-lock.js';
import { createMetrics, type AgentMetrics } from './metrics.js';
import { nodeDatapathProblems, reconcilePods, type PodProblemReporter, type ReconcileReport } from './reconcile.js';
import { repairPods, type RepairActions, type RepairMode, type RepairOutcome } from './repair.js';
import { StateStore } from './state-store.js';
import { startMallocTrimmer, type MallocTrimmer } from './malloc-trim.js';
import { adoptedSizeMessage, type MapSizes, type MapSizeState } from '../loader/map-sizes.js';

/** One line with the LRU maps' sizes; a warning per pinned map that kept another size than asked. */
function logMapSizes(log: Logger, sizes: MapSizeState[]): void {
  log.info({ mapSizes: Object.fromEntries(sizes.map((s) => [s.name, s.maxEntries])) }, 'datapath map sizes');
  for (const s of sizes) if (s.maxEntries !== s.requested) log.warn({ map: s.name, maxEntries: s.maxEntries, requested: s.requested }, adoptedSizeMessage(s));
}

export interface AgentOptions {
  socketPath: string;
  pinRoot: string;
  mode: ModeRequest;
  stateDir: string;
  podSource: PodSource;
  excludeNamespaces: readonly string[];
  logger: Logger;
  /** HOST:PORT for /healthz, /readyz, /metrics; none when undefined. */
  metricsAddr?: string;
  /** Per-pod connection counters on /metrics (namespace/pod labels; cardinality). */
  metricsPerPod?: boolean;
  /** How long ADD waits for an unknown pod (default 5000 ms, below the forwarder's 10 s timeout). */
  podWaitMs?: number;
  /** Period of the self-check that compares every record with the kernel and repairs drift (default 30000 ms; 0: off). */
  selfCheckMs?: number;
  /** Pod inbound programs kept loaded ahead of ADDs (eBPF mode; default INBOUND_POOL; 0: each ADD loads its own). */
  inboundPool?: number;
  /** Posts a pod Event when a pod cannot be restored (the API source does in a cluster). */
  reporter?: PodProblemReporter;
  /** What to do with meshed pods running without capture (default 'repair'; repair.ts). */
  repair?: RepairMode;
  /** Events, labels and deletes for repair (the API source in a cluster). */
  repairActions?: RepairActions;
  /** /proc, where repair looks for a pod's processes (tests). */
  procRoot?: string;
  /** The LRU maps' sizes when the agent creates them (default DEFAULT_MAP_SIZES; pinned maps keep theirs). */
  mapSizes?: MapSizes;
}

export interface Agent {
  mode: Mode;
  handlers: CniHandlers;
  metrics: AgentMetrics;
  store: StateStore;
  /** The node's pod maps (replaced if a self-check has to reload the datapath). */
  readonly ebpf: EbpfBackend | null;
  http: HttpEndpoint | undefined;
  /** What the start-up reconcile did (`pods`: only those not ok). */
  startup: ReconcileReport;
  /** Runs the self-check now (the timer runs it every selfCheckMs). */
  selfCheck(): Promise<ReconcileReport>;
  /** Runs a repair pass now (pod changes and the self-check run it too). */
  repair(): Promise<RepairOutcome[]>;
  /** undefined when ready, else why not. */
  notReady(): string | undefined;
  close(): Promise<void>;
}

/** The self-check visits iptables-mode pods on every IPTABLES_EVERY-th pass (the first included). */
export const IPTABLES_EVERY = 10;

/**
 * Inbound programs loaded ahead (src/pod-datapath/inbound-pool.ts): a burst of
 * this many meshed ADDs pays no program load; ~30 KiB of kernel memory each.
 */
export const INBOUND_POOL = 16;

export async function startAgent(o: AgentOptions): Promise<Agent> {
  const log = o.logger;
  const t0 = performance.now();
  let ebpf: EbpfBackend | null = null;
  let server: CniServer | undefined;
  let http: HttpEndpoint | undefined;
  let datapathLoaded = false;
  let closing = false;
  let timer: NodeJS.Timeout | undefined;
  let datapath: PodDatapath | undefined;
  let running: Promise<ReconcileReport> | undefined;
  let repairing: Promise<RepairOutcome[]> | undefined;
  let repairTimer: NodeJS.Timeout | undefined;
  let onPodChange: (() => void) | undefined;
  let trimmer: MallocTrimmer | undefined;

  const notReady = (): string | undefined => {
    if (closing) return 'shutting down';
    if (!datapathLoaded) return 'datapath not loaded yet';
    if (!o.podSource.synced()) return 'pod source not synced yet';
    if (!server) return 'CNI socket not serving yet';
    return undefined;
  };

  // Where the start-up goes (the ready line's `steps`, ms): a node's
  // cold start is what keeps its pods' ADDs waiting.
  const steps: Record<string, number> = {};
  let mark = t0;
  const step = (name: string) => {
    const now = performance.now();
    steps[name] = Math.round(now - mark);
    mark = now;
  };
  const store = new StateStore(o.stateDir);
  const unreadable = store.open();
  step('stateDir');
  // The pod source lists the node's pods (an API round trip, or the pods
  // file) while the datapath loads and the records are reconciled: neither
  // needs the pods, and ready waits for both.
  const podsSynced = o.podSource.start();
  podsSynced.catch(() => undefined); // awaited below; not unhandled meanwhile
  for (const p of unreadable) log.warn({ problem: p }, 'ignoring an unreadable state record');

  const backendOpts = {
    inboundPool: o.inboundPool ?? INBOUND_POOL,
    onInboundPoolError: (err: Error) => log.warn({ err: err.message, pinRoot: o.pinRoot }, 'could not load an inbound program ahead of a pod: meshed ADDs load their own'),
  };
  const cleanup = async () => {
    closing = true;
    if (timer) clearInterval(timer);
    trimmer?.close();
    if (repairTimer) clearTimeout(repairTimer);
    if (onPodChange) o.podSource.off('change', onPodChange);
    await running?.catch(() => undefined);
    await repairing?.catch(() => undefined);
    await server?.close();
    await o.podSource.stop();
    await http?.close();
    (datapath?.ebpf ?? ebpf)?.close();
  };

  // The start's garbage is collected four times (malloc-trim.ts, collect():
  // a full GC, then malloc_trim), each where a transient would otherwise
  // stack on top of the last one's (the start's peak RSS at 10,000 pods,
  // docs/bench-scale.md round 7): the pod list's parse once it is in (before
  // the datapath's load mallocs), the adoption's before the socket serves
  // (the stub pool's fill and the validator's compile follow), theirs before
  // the first ADDs pile on, and the first repair pass's once it is done.
  const gcMs: number[] = [];
  const collect = () => {
    const ms = trimmer?.collect();
    if (ms === undefined) trimmer?.soon();
    else gcMs.push(Math.round(ms * 10) / 10);
  };
  try {
    // malloc'd pages freed after every burst, the start's included (malloc-trim.ts)
    trimmer = startMallocTrimmer({
      onOverLimit: (rss, limit) => log.warn({ rssMiB: Math.round(rss / 104857.6) / 10, softLimitMiB: limit / 1048576 }, 'the agent\'s memory stays over its soft limit after a full GC (its live data is that large): full GCs back off to once a minute; raise MESHCAP_AGENT_SOFT_LIMIT_MIB if this node runs this many pods'),
    });
    podsSynced.then(() => {
      if (!closing) collect();
    }, () => undefined);
    // --mode iptables needs no kernel probe (and no BPF privileges).
    let mode: Mode = 'iptables';
    let reasons = ['iptables mode forced by --mode iptables'];
    if (o.mode !== 'iptables') {
      const pinned = existsSync(path.join(pinLayout(o.pinRoot).maps, MAP.pods));
      ({ mode, reasons } = pinnedMode(o.mode, pinned, o.pinRoot) ?? await probeKernel(o.mode));
    }
    if (mode === 'ebpf') {
      const loaded = await loadDatapath({ pinRoot: o.pinRoot, ...(o.mapSizes ? { mapSizes: o.mapSizes } : {}) });
      logMapSizes(log, loaded.mapSizes);
      for (const w of loaded.orderWarnings) log.warn({ pinRoot: o.pinRoot, cgroup: loaded.cgroup }, w);
      for (const p of loaded.removedLegacy) log.info({ pin: p }, 'removed a pin of an older meshcap\'s splice (connections still spliced keep it until they close)');
      for (const u of loaded.unavailable) log.warn({ object: u.file, reason: u.reason }, `${u.file} refused by this kernel: its feature is off`);
      ebpf = new EbpfBackend(o.pinRoot, backendOpts);
    }
    datapathLoaded = true;
    step('datapath');

    const metrics = createMetrics(store, () => datapath?.ebpf ?? ebpf, { perPod: o.metricsPerPod === true });
    if (o.metricsAddr) http = await startHttpEndpoint(o.metricsAddr, metrics.registry, notReady);

    const dp = new PodDatapath(ebpf, log);
    datapath = dp;
    const lock = new KeyedLock();
    const base = createAgentHandlers({
      pods: o.podSource,
      store,
      datapath: dp,
      nodeMode: mode,
      excludeNamespaces: o.excludeNamespaces,
      podWaitMs: o.podWaitMs ?? 5000,
      logger: log,
      notReady,
      lock,
    });
    const deps = {
      store,
      datapath: dp,
      nodeMode: mode,
      lock,
      removeAttachment: base.removeAttachment,
      logger: log,
      ...(o.reporter ? { reporter: o.reporter } : {}),
      onOutcome: metrics.reconciled,
    };
    let passes = 0;
    const pass = async (trigger: 'start' | 'self-check', sweepOrphans: boolean): Promise<ReconcileReport> => {
      // The node-wide datapath first: pod entries written into maps no
      // program reads would "restore" nothing.
      if (dp.ebpf) {
        const lost = nodeDatapathProblems(o.pinRoot, dp.ebpf);
        if (lost.length > 0) {
          log.error({ problems: lost, pinRoot: o.pinRoot }, 'the node eBPF datapath is gone: loading it again');
          logMapSizes(log, (await loadDatapath({ pinRoot: o.pinRoot, ...(o.mapSizes ? { mapSizes: o.mapSizes } : {}) })).mapSizes);
          const old = dp.ebpf;
          dp.ebpf = new EbpfBackend(o.pinRoot, backendOpts);
          old.close();
          metrics.nodeReloaded();
        }
      }
      // eBPF pods every pass (a map lookup each); iptables pods, an
      // iptables-save in their netns each (~15 ms), every IPTABLES_EVERY-th.
      const skipIptables = trigger === 'self-check' && passes++ % IPTABLES_EVERY !== 0;
      // A self-check's transient (the maps read whole, ~3 MiB at 10,000
      // pods, and what it moves into old space) starts from a collected
      // heap, not on top of the garbage CNI requests and `meshcap status`
      // left since V8's last major GC, where the registering agent's peak
      // RSS was set (docs/bench-scale.md): a full GC first, once per pass
      // (malloc-trim.ts).
      if (trigger === 'self-check') trimmer?.collect();
      const r = await reconcilePods(deps, trigger, { sweepOrphans, skipIptables });
      metrics.setUnrestored(r.failed);
      return r;
    };
    // An unreadable record may belong to a live pod: sweeping the map entries
    // no readable record owns would take its capture away (fail open).
    if (unreadable.length > 0) log.warn({ unreadable: unreadable.length, stateDir: o.stateDir }, 'not sweeping orphan map entries: unreadable state records may own them; fix or remove those files');
    const startup = await pass('start', unreadable.length === 0);
    step('reconcile');
    await podsSynced;
    step('podSource');
    collect();
    const handlers = metrics.instrument(base);
    const startedAt = new Date().toISOString();
    server = await startCniServer({
      socketPath: o.socketPath, handlers, logger: log.child({ component: 'cni' }),
      // every reply says who answered (`meshcap status`, `meshcap version`)
      identity: () => ({ mode, startedAt, notReady: notReady() ?? null, podSourceSynced: o.podSource.synced(), pid: process.pid }),
    });

    log.info({
      mode,
      reasons,
      pinRoot: mode === 'ebpf' ? o.pinRoot : undefined,
      socket: o.socketPath,
      stateDir: o.stateDir,
      pods: o.podSource.list().length,
      attachments: store.list().length,
      restored: startup.restored,
      dropped: startup.dropped,
      notRestored: startup.failed,
      listenersRegistered: startup.listenersRegistered,
      orphansSwept: startup.orphansSwept,
      slotsSwept: startup.slotsSwept || undefined,
      reconcileMs: startup.ms,
      metrics: http ? `${http.address.address}:${http.address.port}` : undefined,
      startupMs: Math.round(performance.now() - t0),
      steps: (step('serve'), steps),
      // the process's CPU time to here (module loading included): wall time moves with the machine's load
      cpuMs: Math.round((process.cpuUsage().user + process.cpuUsage().system) / 1000),
    }, 'meshcap agent ready');

    const readyAt = performance.now();

    // After ready, not before: the start-up reconcile comes first.
    dp.ebpf?.inboundPool?.fill();
    // The CNI config validator (ajv) is compiled now rather than in the start
    // or in the first ADD.
    setImmediate(() => {
      netConfValidator();
      if (!closing) collect();
    });

    const memMiB = () => Object.fromEntries(Object.entries(process.memoryUsage()).map(([k, v]) => [`${k}MiB`, Math.round(v / 104857.6) / 10]));
    let settledOnce = false;
    const settled = () => {
      if (settledOnce || closing) return;
      settledOnce = true;
      collect();
      // after the trim that follows the GC
      if (gcMs.length > 0) setTimeout(() => log.info({ gcMs, sinceReadyMs: Math.round(performance.now() - readyAt), ...memMiB() }, 'start-up settled: its garbage collected'), 150).unref();
    };

    const repairMode = o.repair ?? 'repair';
    const repairFailedAt = new Map<string, number>();
    const repair = (): Promise<RepairOutcome[]> => {
      // One pass at a time, like the self-check.
      repairing ??= repairPods({
        mode: repairMode,
        pods: () => o.podSource.list(),
        store,
        datapath: dp,
        nodeMode: mode,
        excludeNamespaces: o.excludeNamespaces,
        lock,
        logger: log,
        ...(o.repairActions ? { actions: o.repairActions } : {}),
        ...(o.procRoot ? { procRoot: o.procRoot } : {}),
        failedAt: repairFailedAt,
        onOutcome: metrics.repaired,
      }).finally(() => {
        repairing = undefined;
      });
      return repairing;
    };
    const repairSoon = () => {
      if (closing || repairTimer) return;
      repairTimer = setTimeout(() => {
        repairTimer = undefined;
        repair().catch((err: unknown) => log.error({ err }, 'repair pass failed')).finally(settled);
      }, 200);
      repairTimer.unref();
    };
    if (repairMode !== 'off') {
      // a pod that just got its IP, or one the watch shows for the first time
      onPodChange = repairSoon;
      o.podSource.on('change', onPodChange);
      repairSoon();
    } else setTimeout(settled, 200).unref();

    const selfCheck = (): Promise<ReconcileReport> => {
      // One pass at a time: a slow pass is joined, not stacked.
      running ??= pass('self-check', false).finally(() => {
        running = undefined;
        trimmer?.soon();
      });
      if (repairMode !== 'off') void running.then(() => repairSoon(), () => undefined);
      return running;
    };
    const every = o.selfCheckMs ?? 30_000;
    if (every > 0) {
      timer = setInterval(() => {
        if (closing) return;
        selfCheck().then((r) => {
          if (r.restored + r.dropped + r.failed > 0) {
            log.info({ restored: r.restored, dropped: r.dropped, notRestored: r.failed, ms: r.ms }, 'self-check repaired drift');
          }
        }, (err: unknown) => log.error({ err }, 'self-check failed'));
      }, every);
      timer.unref();
    }

    return {
      mode,
      handlers,
      metrics,
      store,
      get ebpf() {
        return dp.ebpf;
      },
      http,
      // kept for the agent's life: it lists only the pods that were not ok
      startup,
      selfCheck,
      repair,
      notReady,
      close: cleanup,
    };
  } catch (err) {
    await cleanup().catch(() => undefined);
    throw err;
  }
}
