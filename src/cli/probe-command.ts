// `meshcap probe`: what this kernel has, which mode meshcap picks, and why.
import type { Command } from 'commander';
import { REQUIRED_FEATURES } from '../loader/features.js';
import { probeKernel, type ProbeReport } from '../loader/probe.js';

export function formatProbe(r: ProbeReport): string {
  const lines = [`kernel ${r.kernel}`, ''];
  const w = Math.max(...REQUIRED_FEATURES.map((f) => f.name.length));
  for (const spec of REQUIRED_FEATURES) {
    const f = r.features[spec.name];
    const state = f?.ok ? 'ok     ' : 'MISSING';
    lines.push(`  ${spec.name.padEnd(w)}  ${state}  Linux ${spec.since.padEnd(5)} ${spec.why}${f?.detail ? ` (${f.detail})` : ''}`);
  }
  lines.push('', `mode: ${r.mode}`, ...r.reasons.map((x) => `  - ${x}`));
  return lines.join('\n');
}

export function registerProbeCommand(program: Command): void {
  program
    .command('probe')
    .description('probe the kernel for the hooks eBPF mode needs and print the mode meshcap would choose')
    .option('--json', 'machine-readable output')
    .action(async (o: { json?: boolean }) => {
      const r = await probeKernel('auto');
      console.log(o.json ? JSON.stringify(r, null, 2) : formatProbe(r));
    });
}
