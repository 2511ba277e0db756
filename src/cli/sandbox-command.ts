// `meshcap sandbox`: the local demo node (see docs/sandbox.md). Exit 0 when
// every check passed and nothing is left behind, 1 otherwise, 128+n when a
// signal interrupted it (after cleaning up).
import { Option, type Command } from 'commander';
import type { Mode } from '../loader/mode.js';
import type { RuntimeChoice } from '../sandbox/sandbox.js';
import { examples } from './help.js';
// The sandbox is imported in the action: `meshcap --help` does not load it.

interface SandboxFlags {
  runtime: RuntimeChoice;
  modes: string;
  meshed: string;
  connections: string;
  intervalMs: string;
  startupTimeoutMs: string;
  json?: boolean;
  verbose?: boolean;
}

function intFlag(name: string, v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n)) throw new Error(`${name} ${v} is not a whole number`);
  return n;
}

export function registerSandboxCommand(program: Command): void {
  program
    .command('sandbox')
    .description('run a small meshcap node on this machine (podman pods on a chained CNI network, the agent, sidecars, traffic) in eBPF and iptables mode, show what was captured, and remove it all')
    .addHelpText('after', examples(
      'sudo meshcap sandbox',
      'sudo meshcap sandbox --runtime netns --modes iptables --json > report.json',
    ))
    .addOption(new Option('--runtime <runtime>', 'what runs the pods: podman, plain network namespaces (netns), or podman when usable (auto)').choices(['auto', 'podman', 'netns']).default('auto'))
    .addOption(new Option('--modes <list>', 'datapath modes to run, in order').default('ebpf,iptables'))
    .addOption(new Option('--meshed <n>', 'meshed pods').default('3'))
    .addOption(new Option('--connections <n>', 'connections each client pod makes per mode').default('60'))
    .addOption(new Option('--interval-ms <ms>', 'pause between a pod\'s connections').default('100'))
    .addOption(new Option('--startup-timeout-ms <ms>', 'how long the agent, each sidecar and the server may take to start (slow or emulated machines); the CNI, podman and per-connection deadlines stretch by the same factor over 60000').default('60000'))
    .option('--json', 'print the full report as JSON on stdout (the live output goes to stderr)')
    .option('--verbose', 'print every check, not only failed ones')
    .action(async (o: SandboxFlags) => {
      const modes = o.modes.split(',').map((m) => m.trim());
      for (const m of modes) if (m !== 'ebpf' && m !== 'iptables') throw new Error(`--modes: ${m} is not ebpf or iptables`);
      const [{ abortOnSignals, SIGNAL_EXIT, SignalAbort }, { runSandbox }] = await Promise.all([
        import('../sandbox/cleanup.js'), import('../sandbox/sandbox.js'),
      ]);
      const ctl = new AbortController();
      const off = abortOnSignals(ctl, (m) => process.stderr.write(`\nmeshcap sandbox: ${m}\n`));
      try {
        const report = await runSandbox({
          runtime: o.runtime,
          modes: modes as Mode[],
          meshed: intFlag('--meshed', o.meshed),
          connections: intFlag('--connections', o.connections),
          intervalMs: intFlag('--interval-ms', o.intervalMs),
          startupTimeoutMs: intFlag('--startup-timeout-ms', o.startupTimeoutMs),
          // With --json, stdout carries only the report; the human output goes to stderr.
          out: o.json ? process.stderr : process.stdout,
          live: (o.json ? process.stderr : process.stdout).isTTY === true,
          signal: ctl.signal,
          verbose: o.verbose ?? false,
        });
        if (o.json) process.stdout.write(JSON.stringify(report, null, 2) + '\n');
        const reason = ctl.signal.reason as unknown;
        process.exitCode = report.ok ? 0 : report.interrupted && reason instanceof SignalAbort ? SIGNAL_EXIT[reason.signal] ?? 1 : 1;
      } finally {
        off();
      }
    });
}
