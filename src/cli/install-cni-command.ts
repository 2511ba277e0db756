// `meshcap install-cni`: chain meshcap-cni into the node's CNI config and
// copy its binary into the CNI bin dir(s) (src/install-cni/). Without --once or
// --uninstall it keeps them in place until SIGTERM (the DaemonSet's container).
import { Option, type Command } from 'commander';
import { DEFAULT_EXCLUDE_NAMESPACES } from '../decision/meshed.js';
import { AGENT_SOCKET_MAX_LENGTH, AGENT_TIMEOUT_MAX_MS } from '../cni/rules.js';
import { cniBinary } from '../paths.js';
import { UsageError } from './exit.js';
import { examples } from './help.js';

interface InstallCniFlags {
  cniConfDir: string;
  cniBinDir: string[];
  confFile?: string;
  once?: boolean;
  uninstall?: boolean;
  source: string;
  agentSocket: string;
  agentTimeoutMs: string;
  excludeNamespaces: string;
  metricsAddr?: string;
  daemonset?: string;
  kubeconfig?: string;
  removeNodeTaint?: string;
  nodeName?: string;
  agentReadyz: string;
  logLevel: string;
}

const collect = (v: string, prev: string[] | undefined) => [...(prev ?? []), ...v.split(',').map((s) => s.trim()).filter(Boolean)];

export function registerInstallCniCommand(program: Command): void {
  program
    .command('install-cni')
    .description('chain meshcap-cni last into the node\'s CNI config and copy its binary into the CNI bin dir; keeps both in place (re-inserting when the primary CNI rewrites its config) until SIGTERM')
    .requiredOption('--cni-conf-dir <dir>', 'the container runtime\'s CNI network config directory (e.g. /etc/cni/net.d)')
    .requiredOption('--cni-bin-dir <dir>', 'a CNI plugin directory to copy meshcap-cni into (repeatable or comma-separated)', collect)
    .option('--conf-file <name>', 'the config file to chain into (default: the runtime\'s choice, the first loadable file by name)')
    .option('--once', 'install, then exit (no watch)')
    .option('--uninstall', 'remove meshcap-cni from every config in the dir and its binary from the bin dir(s), then exit')
    .addOption(new Option('--source <file>', 'the meshcap-cni executable to install').default(cniBinary))
    .addOption(new Option('--agent-socket <path>', 'agentSocket written into the entry').default('/var/run/meshcap/cni.sock'))
    .addOption(new Option('--agent-timeout-ms <ms>', 'agentTimeoutMs written into the entry').default('10000'))
    .addOption(new Option('--exclude-namespaces <a,b>', 'excludeNamespaces written into the entry (passed through when the agent is unreachable)').default([...DEFAULT_EXCLUDE_NAMESPACES, 'meshcap-system'].join(',')))
    .option('--metrics-addr <host:port>', 'serve /healthz, /readyz (ready when the entry is in the active config) and /metrics here')
    .option('--daemonset <namespace/name>', 'the DaemonSet running this container: on SIGTERM the entry and binary are removed only when it is gone or being deleted')
    .option('--kubeconfig <file>', 'kubeconfig for the --daemonset check and --remove-node-taint (default: in-cluster)')
    .option('--remove-node-taint <key>', 'remove this taint from the node once meshcap-cni is chained and the agent is ready (keeps pods off a node until meshcap can capture them)')
    .option('--node-name <name>', 'this node, for --remove-node-taint (default: $NODE_NAME)')
    .addOption(new Option('--agent-readyz <url>', 'the agent\'s /readyz, for --remove-node-taint').default('http://127.0.0.1:9964/readyz'))
    .addOption(new Option('--log-level <level>', 'pino log level').choices(['debug', 'info', 'warn', 'error']).default('info'))
    .addHelpText('after', examples(
      'meshcap install-cni --cni-conf-dir /host/etc/cni/net.d --cni-bin-dir /host/opt/cni/bin --metrics-addr :9965 --daemonset meshcap-system/meshcap',
      'meshcap install-cni --cni-conf-dir /etc/cni/net.d --cni-bin-dir /opt/cni/bin --once',
      'meshcap install-cni --cni-conf-dir /etc/cni/net.d --cni-bin-dir /opt/cni/bin --uninstall',
    ))
    .action(async (o: InstallCniFlags) => {
      if (o.once && o.uninstall) throw new UsageError('--once and --uninstall exclude each other');
      const timeout = Number(o.agentTimeoutMs);
      if (!Number.isInteger(timeout) || timeout < 1 || timeout > AGENT_TIMEOUT_MAX_MS) throw new UsageError(`--agent-timeout-ms ${o.agentTimeoutMs} is not a number of milliseconds (1..${AGENT_TIMEOUT_MAX_MS})`);
      if (!o.agentSocket.startsWith('/') || o.agentSocket.length > AGENT_SOCKET_MAX_LENGTH) throw new UsageError(`--agent-socket must be an absolute path of at most ${AGENT_SOCKET_MAX_LENGTH} bytes`);
      if (o.confFile && (o.confFile.includes('/') || !/\.(conflist|conf|json)$/.test(o.confFile))) throw new UsageError(`--conf-file ${o.confFile} must be a file name in --cni-conf-dir ending .conflist, .conf or .json`);
      let daemonSet: { namespace: string; name: string } | undefined;
      if (o.daemonset) {
        const m = /^([a-z0-9-]+)\/([a-z0-9.-]+)$/.exec(o.daemonset);
        if (!m) throw new UsageError(`--daemonset ${o.daemonset} is not NAMESPACE/NAME`);
        daemonSet = { namespace: m[1]!, name: m[2]! };
      }
      const excludeNamespaces = o.excludeNamespaces.split(',').map((s) => s.trim()).filter(Boolean);
      const entry = { type: 'meshcap-cni' as const, agentSocket: o.agentSocket, agentTimeoutMs: timeout, excludeNamespaces };
      const { pino } = await import('pino');
      const logger = pino({ name: 'meshcap-install-cni', level: o.logLevel });
      const { CniInstaller, uninstallCni } = await import('../install-cni/installer.js');
      if (o.uninstall) {
        const r = uninstallCni({ confDir: o.cniConfDir, binDirs: o.cniBinDir, logger });
        process.stdout.write(`removed meshcap-cni from ${r.files.length} config file(s)${r.files.length ? `: ${r.files.join(', ')}` : ''}; binaries removed: ${r.binaries.join(', ') || 'none'}\n`);
        return;
      }
      if (o.once) {
        const installer = new CniInstaller({ confDir: o.cniConfDir, binDirs: o.cniBinDir, ...(o.confFile ? { confFile: o.confFile } : {}), entry, source: o.source, logger });
        const r = installer.sync();
        if (!r.chain.ok) throw new Error(`meshcap-cni is not in the CNI chain: ${r.chain.detail}`);
        process.stdout.write(`${r.chain.detail}${r.wrote ? ` (${r.wrote})` : ' (already there)'}\n`);
        return;
      }
      const { runInstallCni } = await import('../install-cni/run.js');
      const signal = new Promise<string>((resolve) => {
        process.once('SIGTERM', () => resolve('SIGTERM'));
        process.once('SIGINT', () => resolve('SIGINT'));
      });
      let kubeConfig: (() => import('@kubernetes/client-node').KubeConfig) | undefined;
      const nodeName = o.nodeName ?? process.env.NODE_NAME;
      if (o.removeNodeTaint && !nodeName) throw new UsageError('--remove-node-taint needs --node-name or $NODE_NAME');
      if (daemonSet || o.removeNodeTaint) {
        const { loadKubeConfig } = await import('../kube/api-source.js');
        kubeConfig = () => loadKubeConfig(o.kubeconfig);
      }
      await runInstallCni({
        confDir: o.cniConfDir,
        binDirs: o.cniBinDir,
        ...(o.confFile ? { confFile: o.confFile } : {}),
        entry,
        source: o.source,
        logger,
        ...(o.metricsAddr ? { metricsAddr: o.metricsAddr } : {}),
        ...(daemonSet && kubeConfig ? { daemonSet: { ...daemonSet, kubeConfig } } : {}),
        ...(o.removeNodeTaint && kubeConfig && nodeName ? { taint: { key: o.removeNodeTaint, nodeName, agentReadyz: o.agentReadyz, kubeConfig } } : {}),
      }, signal);
    });
}
