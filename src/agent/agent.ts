// The node agent's life cycle: probe -> mode; eBPF: load (adopting pins) and
// open the pod maps; state dir; pod source synced; reconcile what a previous
// agent left; serve CNI; ready. close() stops serving and leaves the datapath
// in place: traffic keeps flowing while the agent is down.
import { existsSync } from 'node:fs';
import type { Logger } from 'pino';
import { startCniServer, type CniServer } from '../cni/server.js';
import type { CniHandlers } from '../cni/types.js';
import type { PodSource } from '../kube/pod-source.js';
import { loadDatapath } from '../loader/datapath.js';
import type { Mode, ModeRequest } from '../loader/mode.js';
import { probeKernel } from '../loader/probe.js';
import { EbpfPods } from '../maps/ebpf-pods.js';
import { createAgentHandlers } from './handlers.js';
import { startHttpEndpoint, type HttpEndpoint } from './http.js';
import { createMetrics, type AgentMetrics } from './metrics.js';
import { PodDatapath } from './pod-datapath.js';
import { cookieOf, StateStore } from './state-store.js';

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
  /** The app<->proxy sk_msg splice (eBPF mode; the loader turns it on unless false). */
  splice?: boolean;
  /** How long ADD waits for an unknown pod (default 5000 ms, below the forwarder's 10 s timeout). */
  podWaitMs?: number;
}

export interface Agent {
  mode: Mode;
  handlers: CniHandlers;
  metrics: AgentMetrics;
  store: StateStore;
  ebpf: EbpfPods | null;
  http: HttpEndpoint | undefined;
  /** undefined when ready, else why not. */
  notReady(): string | undefined;
  close(): Promise<void>;
}

export async function startAgent(o: AgentOptions): Promise<Agent> {
  const log = o.logger;
  const t0 = performance.now();
  let ebpf: EbpfPods | null = null;
  let server: CniServer | undefined;
  let http: HttpEndpoint | undefined;
  let datapathLoaded = false;
  let closing = false;

  const notReady = (): string | undefined => {
    if (closing) return 'shutting down';
    if (!datapathLoaded) return 'datapath not loaded yet';
    if (!o.podSource.synced()) return 'pod source not synced yet';
    if (!server) return 'CNI socket not serving yet';
    return undefined;
  };

  const store = new StateStore(o.stateDir);
  for (const p of store.open()) log.warn({ problem: p }, 'ignoring an unreadable state record');

  const cleanup = async () => {
    closing = true;
    await server?.close();
    await o.podSource.stop();
    await http?.close();
    ebpf?.close();
  };

  try {
    // --mode iptables needs no kernel probe (and no BPF privileges).
    let mode: Mode = 'iptables';
    let reasons = ['iptables mode forced by --mode iptables'];
    if (o.mode !== 'iptables') {
      const probe = await probeKernel(o.mode);
      mode = probe.mode;
      reasons = probe.reasons;
    }
    if (mode === 'ebpf') {
      await loadDatapath({ pinRoot: o.pinRoot, splice: o.splice });
      ebpf = new EbpfPods(o.pinRoot);
    }
    datapathLoaded = true;

    const metrics = createMetrics(store, ebpf);
    if (o.metricsAddr) http = await startHttpEndpoint(o.metricsAddr, metrics.registry, notReady);

    await o.podSource.start();
    const datapath = new PodDatapath(ebpf, log);
    const base = createAgentHandlers({
      pods: o.podSource,
      store,
      datapath,
      nodeMode: mode,
      excludeNamespaces: o.excludeNamespaces,
      podWaitMs: o.podWaitMs ?? 5000,
      logger: log,
      notReady,
    });
    const reconciled = await reconcile(store, ebpf, base.removeAttachment, log);
    const handlers = metrics.instrument(base);
    server = await startCniServer({ socketPath: o.socketPath, handlers, logger: log.child({ component: 'cni' }) });

    log.info({
      mode,
      reasons,
      pinRoot: mode === 'ebpf' ? o.pinRoot : undefined,
      socket: o.socketPath,
      stateDir: o.stateDir,
      pods: o.podSource.list().length,
      attachments: store.list().length,
      ...reconciled,
      metrics: http ? `${http.address.address}:${http.address.port}` : undefined,
      startupMs: Math.round(performance.now() - t0),
    }, 'meshcap agent ready');

    return {
      mode,
      handlers,
      metrics,
      store,
      ebpf,
      http,
      notReady,
      close: cleanup,
    };
  } catch (err) {
    await cleanup().catch(() => undefined);
    throw err;
  }
}

/**
 * What changed while no agent was running: attachments whose netns is gone
 * (their DEL went unanswered) are removed, and eBPF pod entries that no record
 * owns (an agent died between map write and record) are swept. Runs before
 * the CNI socket serves, so no ADD can be in flight.
 */
async function reconcile(
  store: StateStore,
  ebpf: EbpfPods | null,
  remove: (rec: ReturnType<StateStore['list']>[number]) => Promise<void>,
  log: Logger,
): Promise<{ staleRemoved: number; orphansSwept: number }> {
  let staleRemoved = 0;
  for (const rec of store.list()) {
    if (existsSync(rec.netns)) continue;
    try {
      await remove(rec);
      staleRemoved++;
    } catch (err) {
      log.warn({ pod: `${rec.podNamespace}/${rec.podName}`, err }, 'cannot remove a stale attachment');
    }
  }
  let orphansSwept = 0;
  if (ebpf) {
    const owned = new Set(store.list().filter((r) => r.mode === 'ebpf').map((r) => cookieOf(r)));
    for (const cookie of ebpf.pods()) {
      if (owned.has(cookie)) continue;
      ebpf.unregister(cookie);
      orphansSwept++;
    }
  }
  return { staleRemoved, orphansSwept };
}
