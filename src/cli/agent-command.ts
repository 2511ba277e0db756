// `meshcap agent`: the node daemon (CNI socket, pod source, datapath writes,
// health and metrics). Stops cleanly on SIGTERM/SIGINT, leaving the datapath
// in place for the next agent to adopt.
// The agent, the pod sources, pino and the Kubernetes client are imported in
// the action: `meshcap --help` loads none of them (test/unit/cli/startup-imports.test.ts).
import os from 'node:os';
import { setFlagsFromString } from 'node:v8';
import { Option, type Command } from 'commander';
import type { Logger } from 'pino';
import { DEFAULT_STATE_DIR } from '../agent/state-store.js';
import { DEFAULT_EXCLUDE_NAMESPACES } from '../decision/meshed.js';
import type { PodSource } from '../kube/pod-source.js';
import type { ModeRequest } from '../loader/mode.js';
import { mapSizeOption, mapSizesOrUsage, modeOption, pinRootOption, removedSpliceOption, SPLICE_REMOVED, type MapSizeFlags } from './datapath-commands.js';
import { UsageError } from './exit.js';
import { examples } from './help.js';

interface AgentFlags extends MapSizeFlags {
  standalone?: boolean;
  pods?: string;
  kubeconfig?: string;
  nodeName?: string;
  socket: string;
  pinRoot: string;
  mode: ModeRequest;
  metricsAddr?: string;
  metricsPerPod?: boolean;
  stateDir: string;
  excludeNamespaces: string;
  podWaitMs: string;
  selfCheckInterval: string;
  logLevel: string;
  splice?: boolean;
  repair: 'repair' | 'label' | 'delete' | 'off';
}

async function podSource(o: AgentFlags, logger: Logger): Promise<{ source: PodSource; api: boolean }> {
  if (o.standalone) {
    if (!o.pods) throw new UsageError('--standalone needs --pods FILE (the pods this node runs)');
    const { FileSource } = await import('../kube/file-source.js');
    return { source: new FileSource({ path: o.pods, logger }), api: false };
  }
  if (o.pods) throw new UsageError('--pods is for --standalone; without it the agent watches the Kubernetes API');
  const nodeName = o.nodeName ?? process.env.NODE_NAME ?? os.hostname();
  const { ApiSource, loadKubeConfig } = await import('../kube/api-source.js');
  return { source: new ApiSource({ kubeConfig: loadKubeConfig(o.kubeconfig), nodeName, logger }), api: true };
}

export function registerAgentCommand(program: Command): void {
  program
    .command('agent')
    .description('run the node agent: serve the meshcap-cni plugin and set up each meshed pod\'s redirect')
    .addHelpText('after', examples(
      'meshcap agent --metrics-addr 0.0.0.0:9102',
      'meshcap agent --standalone --pods /etc/meshcap/pods.yaml --mode iptables',
    ))
    .option('--standalone', 'no API server: pods come from --pods FILE')
    .option('--pods <file>', 'Pod manifests (YAML or JSON), followed for changes (with --standalone)')
    .option('--kubeconfig <file>', 'kubeconfig for the pod watch (default: in-cluster, then $KUBECONFIG / ~/.kube/config)')
    .option('--node-name <name>', 'this node (default: $NODE_NAME, else the host name)')
    .addOption(new Option('--socket <path>', 'CNI socket the meshcap-cni plugin connects to').default('/var/run/meshcap/cni.sock'))
    .addOption(pinRootOption())
    .addOption(modeOption())
    .option('--metrics-addr <host:port>', 'serve /healthz, /readyz and /metrics here')
    .option('--metrics-per-pod', 'also export connection counters per pod (namespace and pod labels: one series per pod and direction)')
    .addOption(new Option('--state-dir <dir>', 'where attachment records live').default(DEFAULT_STATE_DIR))
    .addOption(new Option('--exclude-namespaces <a,b>', 'namespaces never redirected').default(DEFAULT_EXCLUDE_NAMESPACES.join(',')))
    .addOption(new Option('--pod-wait-ms <ms>', 'how long ADD waits for a pod the source does not know yet').default('5000'))
    .addOption(new Option('--self-check-interval <seconds>', 'how often every pod\'s datapath is compared with its record and repaired (0: only at start)').default('30'))
    .addOption(new Option('--repair <action>', 'meshed pods found running without capture (started before meshcap-cni was in the CNI chain): capture them in place through their netns (repair), label them meshcap.io/uncaptured=true, delete them, or only report (off); an Event on the pod either way').choices(['repair', 'label', 'delete', 'off']).default('repair'))
    .addOption(mapSizeOption('mc_origdst'))
    .addOption(mapSizeOption('mc_sockorig'))
    .addOption(mapSizeOption('mc_dnsorig'))
    .addOption(mapSizeOption('mc_dstslot'))
    .addOption(mapSizeOption('mc_listen'))
    .addOption(removedSpliceOption())
    .addOption(new Option('--log-level <level>', 'pino log level').choices(['debug', 'info', 'warn', 'error']).default('info'))
    .action(async (o: AgentFlags) => {
      // V8 sized for a small heap: --optimize-for-size's slower heap growth
      // (agent RSS at 10,000 pods 164 -> 116 MiB with --max-semi-space-size=1,
      // no more CPU measured: docs/bench-scale.md, "Agent memory"). Set here
      // because NODE_OPTIONS refuses it; MESHCAP_AGENT_OPTIMIZE_FOR_SIZE=0 to compare.
      if (process.env.MESHCAP_AGENT_OPTIMIZE_FOR_SIZE !== '0') setFlagsFromString('--optimize-for-size');
      const podWaitMs = Number(o.podWaitMs);
      if (!Number.isInteger(podWaitMs) || podWaitMs < 0 || podWaitMs > 600_000) throw new UsageError(`--pod-wait-ms ${o.podWaitMs} is not a number of milliseconds (0..600000)`);
      const selfCheckS = Number(o.selfCheckInterval);
      if (!Number.isFinite(selfCheckS) || selfCheckS < 0 || selfCheckS > 86_400) throw new UsageError(`--self-check-interval ${o.selfCheckInterval} is not a number of seconds (0..86400)`);
      const mapSizes = mapSizesOrUsage(o);
      const [{ pino }, { startAgent }] = await Promise.all([import('pino'), import('../agent/agent.js')]);
      const logger = pino({ name: 'meshcap-agent', level: o.logLevel });
      if (o.splice) logger.warn({ flag: '--splice' }, SPLICE_REMOVED);
      const { source, api } = await podSource(o, logger);
      const agent = await startAgent({
        socketPath: o.socket,
        pinRoot: o.pinRoot,
        mode: o.mode,
        stateDir: o.stateDir,
        podSource: source,
        // In a cluster a pod that cannot be restored also gets a Warning Event.
        ...(api ? { reporter: source as import('../kube/api-source.js').ApiSource, repairActions: source as import('../kube/api-source.js').ApiSource } : {}),
        repair: o.repair,
        excludeNamespaces: o.excludeNamespaces.split(',').map((s) => s.trim()).filter(Boolean),
        logger,
        ...(o.metricsAddr ? { metricsAddr: o.metricsAddr } : {}),
        metricsPerPod: o.metricsPerPod === true,
        podWaitMs,
        selfCheckMs: Math.round(selfCheckS * 1000),
        mapSizes,
      });
      await new Promise<void>((resolve) => {
        const stop = (signal: string) => {
          logger.info({ signal }, 'meshcap agent stopping (the datapath stays in place)');
          resolve();
        };
        process.once('SIGTERM', () => stop('SIGTERM'));
        process.once('SIGINT', () => stop('SIGINT'));
      });
      await agent.close();
    });
}
