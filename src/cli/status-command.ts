// `meshcap status`: this node's agent first (socket, ready, mode, version,
// uptime, pod source, CNI chain), then the pods in the datapath, read from the
// agent's state dir and the pinned maps (that part works without an agent).
import { Option, type Command } from 'commander';
import { DEFAULT_STATE_DIR } from '../agent/state-store.js';
import { DEFAULT_CNI_CONF_DIR } from '../agent/node-health.js';
import { pinRootOption } from './datapath-commands.js';
import { checkDirOption } from './preflight.js';
import { examples } from './help.js';
import { DEFAULT_CNI_SOCKET } from './version-command.js';

interface StatusFlags {
  json?: boolean;
  output?: 'table' | 'wide' | 'json' | 'yaml';
  namespace?: string;
  stateDir: string;
  pinRoot: string;
  socket: string;
  cniConfDir: string;
}

const NEEDS_ROOT = 'reading the pods needs root (the agent\'s records, the pinned BPF maps and the iptables counters in each pod\'s netns are root-only): run it as root, e.g. sudo meshcap status';

export function registerStatusCommand(program: Command): void {
  program
    .command('status')
    .description('this node\'s agent (reachable, ready, mode, version, uptime, pod source, CNI chain), then every pod in the datapath: mode, profile, capture settings, live connection counters, and whether its datapath matches its record')
    .argument('[pod]', 'only this pod (NAME or NAMESPACE/NAME)')
    .addOption(new Option('-o, --output <format>', 'output format').choices(['table', 'wide', 'json', 'yaml']))
    .option('--json', 'the same as -o json')
    .option('-n, --namespace <ns>', 'only pods in this namespace')
    .addOption(new Option('--state-dir <dir>', 'the agent\'s state directory').default(DEFAULT_STATE_DIR))
    .addOption(pinRootOption())
    .addOption(new Option('--socket <path>', 'the agent\'s CNI socket').default(DEFAULT_CNI_SOCKET))
    .addOption(new Option('--cni-conf-dir <dir>', 'the container runtime\'s CNI network config directory').default(DEFAULT_CNI_CONF_DIR))
    .addHelpText('after', [
      '',
      'Exit codes: 0 every pod matches its record; 1 a pod is missing, differs or has no record, a record is unreadable,',
      'or the pods could not be read (not root); 2 usage. An unreachable agent is shown, not an exit code: the datapath',
      'keeps working without it.',
    ].join('\n') + examples('sudo meshcap status', 'sudo meshcap status -n shop -o wide', 'sudo meshcap status shop/web -o json'))
    .action(async (podArg: string | undefined, o: StatusFlags) => {
      checkDirOption('--state-dir', o.stateDir);
      const format = o.output ?? (o.json ? 'json' : 'table');
      const { collectNodeHealth, formatNodeHealth } = await import('../agent/node-health.js');
      const health = await collectNodeHealth({ socket: o.socket, cniConfDir: o.cniConfDir });
      const root = (process.geteuid?.() ?? 0) === 0;
      let report: import('../agent/status.js').StatusReport | undefined;
      let formatStatus: typeof import('../agent/status.js').formatStatus | undefined;
      if (root) {
        // The status collector (addon, execa, pino) is loaded only when it runs.
        const m = await import('../agent/status.js');
        formatStatus = m.formatStatus;
        report = await m.collectStatus({ stateDir: o.stateDir, pinRoot: o.pinRoot });
        const [ns, name] = podArg?.includes('/') ? podArg.split('/', 2) : [o.namespace, podArg];
        report.pods = report.pods.filter((p) => (ns === undefined || p.namespace === ns) && (name === undefined || p.name === name));
      }
      if (format === 'json' || format === 'yaml') {
        const doc = { agent: health, ...(report ?? { pods: null, problems: [NEEDS_ROOT] }) };
        process.stdout.write(format === 'json' ? `${JSON.stringify(doc, null, 2)}\n` : (await import('yaml')).stringify(doc));
      } else {
        const out = [formatNodeHealth(health), ''];
        out.push(report && formatStatus ? formatStatus(report, { wide: format === 'wide' }) : `pods: ${NEEDS_ROOT}`);
        console.log(out.join('\n'));
      }
      if (!report || report.pods.some((p) => p.state === 'missing' || p.state === 'drift' || p.state === 'orphan') || report.problems.length > 0) process.exitCode = 1;
    });
}
