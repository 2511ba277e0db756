// `meshcap probe`: what this kernel has, which mode meshcap picks, and why.
import { rmdirSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import type { Command } from 'commander';
import { OPTIONAL_FEATURES, REQUIRED_FEATURES } from '../loader/features.js';
import type { ProbeReport } from '../loader/probe.js';
import { requireRoot } from './preflight.js';
import { examples } from './help.js';

export function formatProbe(r: ProbeReport): string {
  const lines = [`kernel ${r.kernel}`, ''];
  const w = Math.max(...REQUIRED_FEATURES.map((f) => f.name.length));
  for (const spec of REQUIRED_FEATURES) {
    const f = r.features[spec.name];
    const state = f?.ok ? 'ok     ' : f?.denied ? 'DENIED ' : 'MISSING';
    lines.push(`  ${spec.name.padEnd(w)}  ${state}  Linux ${spec.since.padEnd(5)} ${spec.why}${f?.detail ? ` (${f.detail})` : ''}`);
  }
  lines.push('', 'optional (each switches one behaviour, never the mode):');
  for (const spec of Object.values(OPTIONAL_FEATURES)) {
    const f = r.optional[spec.name];
    lines.push(`  ${spec.name.padEnd(w)}  ${f?.ok ? 'ok     ' : 'absent '}  Linux ${spec.since.padEnd(5)} ${spec.why}`);
  }
  lines.push('', `mode: ${r.mode}`, ...r.reasons.map((x) => `  - ${x}`));
  return lines.join('\n');
}

/** 128 + signal number, as a shell reports a process a signal ended. */
const SIGNAL_EXIT = { SIGINT: 130, SIGTERM: 143 } as const;

/**
 * The probe creates a netns and a cgroup (meshcap-probe-<pid>) and removes
 * them when it is done. Ctrl-C would kill it in between, leaving both: the
 * first SIGINT/SIGTERM lets the probe finish its cleanup and then exits
 * 128+n; a second one removes them here and exits at once.
 */
async function probeUntilDone(): Promise<ProbeReport | undefined> {
  let signalled: keyof typeof SIGNAL_EXIT | undefined;
  const onSignal = (sig: keyof typeof SIGNAL_EXIT) => {
    if (signalled) {
      void removeProbeTargets(process.pid).finally(() => process.exit(SIGNAL_EXIT[sig]));
      return;
    }
    signalled = sig;
    process.stderr.write(`\nmeshcap probe: ${sig}: removing the probe's netns and cgroup\n`);
  };
  const onInt = () => onSignal('SIGINT');
  const onTerm = () => onSignal('SIGTERM');
  process.on('SIGINT', onInt);
  process.on('SIGTERM', onTerm);
  try {
    // The probe (and with it the addon) is loaded only when it runs.
    const { probeKernel } = await import('../loader/probe.js');
    const r = await probeKernel('auto');
    if (signalled) {
      process.exitCode = SIGNAL_EXIT[signalled];
      return undefined;
    }
    return r;
  } finally {
    process.off('SIGINT', onInt);
    process.off('SIGTERM', onTerm);
  }
}

/** Best effort: the names src/loader/probe.ts gives its targets. */
export async function removeProbeTargets(pid: number): Promise<void> {
  const name = `meshcap-probe-${pid}`;
  try {
    execFileSync('ip', ['netns', 'del', name], { stdio: 'ignore' });
  } catch { /* not there */ }
  const { findCgroup2 } = await import('../loader/mounts.js');
  const root = findCgroup2();
  if (root) {
    try {
      rmdirSync(`${root}/${name}`);
    } catch { /* not there */ }
  }
}

export function registerProbeCommand(program: Command): void {
  program
    .command('probe')
    .description('probe the kernel for the hooks eBPF mode needs and print the mode meshcap would choose')
    .addHelpText('after', examples(
      'sudo meshcap probe',
      'sudo meshcap probe --json | jq .mode',
    ))
    .option('--json', 'machine-readable output')
    .action(async (o: { json?: boolean }) => {
      requireRoot('probe', 'trial-loads BPF programs and attaches them to a probe cgroup and network namespace');
      const r = await probeUntilDone();
      if (!r) return;
      console.log(o.json ? JSON.stringify(r, null, 2) : formatProbe(r));
    });
}
