// `meshcap status`: the pods in this node's datapath, read from the agent's
// state dir and the pinned maps; works without a running agent.
import { Option, type Command } from 'commander';
import { DEFAULT_STATE_DIR } from '../agent/state-store.js';
import { pinRootOption } from './datapath-commands.js';
import { checkDirOption, requireRoot } from './preflight.js';

export function registerStatusCommand(program: Command): void {
  program
    .command('status')
    .description('every pod in the datapath: mode, profile, capture settings, live connection counters, and whether its datapath matches its record')
    .option('--json', 'machine-readable output')
    .addOption(new Option('--state-dir <dir>', 'the agent\'s state directory').default(DEFAULT_STATE_DIR))
    .addOption(pinRootOption())
    .action(async (o: { json?: boolean; stateDir: string; pinRoot: string }) => {
      checkDirOption('--state-dir', o.stateDir);
      requireRoot('status', 'reads the agent\'s records, the pinned BPF maps and iptables counters inside pod network namespaces');
      // The status collector (addon, execa, pino) is loaded only when it runs.
      const { collectStatus, formatStatus } = await import('../agent/status.js');
      const r = await collectStatus({ stateDir: o.stateDir, pinRoot: o.pinRoot });
      console.log(o.json ? JSON.stringify(r, null, 2) : formatStatus(r));
      if (r.pods.some((p) => p.state === 'missing' || p.state === 'drift' || p.state === 'orphan') || r.problems.length > 0) process.exitCode = 1;
    });
}
