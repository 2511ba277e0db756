// `meshcap install-cni` as a process: install, then (without --once) keep the
// entry and binary in place, serve /healthz /readyz /metrics, and on SIGTERM
// decide (owner.ts) whether meshcap is being uninstalled.
//
// It runs as its own container in the DaemonSet pod, beside the agent: it
// needs write access to the host's CNI dirs and no capability at all, while
// the agent needs BPF/netns capabilities and no CNI dirs. Its /readyz is the
// pod's second readiness gate: the pod is Ready only when the agent is ready
// and meshcap-cni is last in the config the runtime uses.
import { Counter, Gauge, Registry } from 'prom-client';
import type { KubeConfig } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { startHttpEndpoint, type HttpEndpoint } from '../agent/http.js';
import type { MeshcapEntry } from './config.js';
import { CniInstaller, uninstallCni } from './installer.js';
import { DaemonSetWatch, terminationVerdict, type OwnerVerdict } from './owner.js';
import { agentReady, TaintRemover } from './taint.js';

export interface InstallCniRun {
  confDir: string;
  binDirs: string[];
  confFile?: string;
  entry: MeshcapEntry;
  source: string;
  logger: Logger;
  metricsAddr?: string;
  /** namespace/name of the DaemonSet that owns this pod (the uninstall decision); none: never remove on SIGTERM. */
  daemonSet?: { namespace: string; name: string; kubeConfig: () => KubeConfig };
  resyncMs?: number;
  /** Remove this node taint once meshcap-cni is chained and the agent's /readyz answers 200 (taint.ts). */
  taint?: { key: string; nodeName: string; agentReadyz: string; kubeConfig: () => KubeConfig };
}

export interface InstallCniMetrics {
  registry: Registry;
  reinsertions: Counter<'action'>;
  binaryRestores: Counter<'dir'>;
}

export function createInstallMetrics(ready: () => boolean): InstallCniMetrics {
  const registry = new Registry();
  const reinsertions = new Counter({
    name: 'meshcap_cni_config_reinsertions_total',
    help: 'Times install-cni found meshcap-cni missing or different in the CNI config the runtime uses (the primary CNI rewrote or replaced it) and put it back, by what it wrote (inserted, replaced, converted)',
    labelNames: ['action'] as const,
    registers: [registry],
  });
  const binaryRestores = new Counter({
    name: 'meshcap_cni_binary_restores_total',
    help: 'Times install-cni found the meshcap-cni binary missing or different in a CNI bin dir and copied it back',
    labelNames: ['dir'] as const,
    registers: [registry],
  });
  new Gauge({
    name: 'meshcap_cni_config_installed',
    help: '1 when meshcap-cni is the last plugin of the CNI config the runtime uses, else 0 (new pods would not be captured)',
    registers: [registry],
    collect() {
      this.set(ready() ? 1 : 0);
    },
  });
  return { registry, reinsertions, binaryRestores };
}

/** Installs and watches until SIGTERM/SIGINT; returns what it did on the way out. */
export async function runInstallCni(o: InstallCniRun, signal: Promise<string>): Promise<{ removed: boolean; verdict: OwnerVerdict }> {
  const log = o.logger;
  let installer: CniInstaller | undefined;
  const metrics = createInstallMetrics(() => installer?.notReady() === undefined);
  installer = new CniInstaller({
    confDir: o.confDir,
    binDirs: o.binDirs,
    ...(o.confFile ? { confFile: o.confFile } : {}),
    entry: o.entry,
    source: o.source,
    logger: log,
    ...(o.resyncMs ? { resyncMs: o.resyncMs } : {}),
    onReinsert: (action) => metrics.reinsertions.inc({ action }),
    onBinaryRestore: (dir) => metrics.binaryRestores.inc({ dir }),
  });
  let http: HttpEndpoint | undefined;
  let watch: DaemonSetWatch | undefined;
  let taint: TaintRemover | undefined;
  try {
    if (o.daemonSet) {
      watch = new DaemonSetWatch(o.daemonSet.kubeConfig(), o.daemonSet.namespace, o.daemonSet.name, log.child({ component: 'install-cni' }));
      await watch.start();
    }
    if (o.metricsAddr) http = await startHttpEndpoint(o.metricsAddr, metrics.registry, () => installer!.notReady());
    installer.start();
    if (o.taint) {
      const t = o.taint;
      taint = new TaintRemover({
        kubeConfig: t.kubeConfig(), nodeName: t.nodeName, key: t.key, logger: log.child({ component: 'install-cni' }),
        ready: async () => installer!.notReady() === undefined && (await agentReady(t.agentReadyz)),
      });
      taint.start();
    }
    const sig = await signal;
    taint?.stop();
    installer.stop();
    let verdict: OwnerVerdict = { remove: false, why: 'no --daemonset given: the CNI entry and binary stay (run the uninstall Job to remove them)' };
    if (o.daemonSet) verdict = await terminationVerdict(o.daemonSet.kubeConfig(), o.daemonSet.namespace, o.daemonSet.name, watch);
    if (verdict.remove) {
      const r = uninstallCni({ confDir: o.confDir, binDirs: o.binDirs, logger: log });
      log.info({ signal: sig, why: verdict.why, files: r.files, binaries: r.binaries }, 'install-cni stopping: meshcap removed from the CNI chain');
    } else {
      log.info({ signal: sig, why: verdict.why }, 'install-cni stopping: the CNI entry and binary stay in place');
    }
    return { removed: verdict.remove, verdict };
  } finally {
    taint?.stop();
    watch?.stop();
    installer.stop();
    await http?.close();
  }
}
