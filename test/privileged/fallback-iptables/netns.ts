// Test helpers: throwaway network namespaces and host-state snapshots.
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { addNetns, delNetns } from '../../../src/lab/index.js';

export async function sh(cmd: string, args: string[], input?: string): Promise<string> {
  const r = await execa(cmd, args, { input, reject: false });
  if (r.exitCode !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (${r.exitCode}): ${r.stderr}`);
  return r.stdout;
}

export async function makeNetns(prefix: string): Promise<{ name: string; path: string }> {
  const name = `${prefix}-${process.pid}-${randomBytes(3).toString('hex')}`;
  return { name, path: await addNetns(name) };
}

export async function deleteNetns(name: string): Promise<void> {
  await delNetns(name).catch(() => undefined);
}

export async function inNs(name: string, cmd: string, args: string[]): Promise<string> {
  return sh('ip', ['netns', 'exec', name, cmd, ...args]);
}

/**
 * The host's rules, as iptables-save prints them, minus the "# Generated ...
 * on <date>" comments, packet/byte counters (host traffic moves those) and
 * tables that hold nothing but built-in chains with ACCEPT policy: on kernels
 * with x_tables as modules (5.10 in the VM matrix), the first legacy iptables
 * call in a test netns loads iptable_nat/iptable_filter, which registers that
 * empty table in every netns, the host's too. That is a module load, not a rule.
 */
export async function hostRules(): Promise<string> {
  const out: string[] = [];
  for (const bin of ['iptables-save', 'ip6tables-save', 'iptables-legacy-save', 'ip6tables-legacy-save']) {
    const r = await execa(bin, [], { reject: false });
    out.push(`## ${bin} rc=${r.exitCode}`, withoutEmptyTables(r.stdout.split('\n').filter((l) => !l.startsWith('#')).join('\n').replace(/\[\d+:\d+\]/g, '[-]')));
  }
  return out.join('\n');
}

/** Drops "*table ... COMMIT" blocks whose only lines are built-in chains (policy ACCEPT). */
export function withoutEmptyTables(save: string): string {
  const kept: string[] = [];
  let block: string[] | undefined;
  for (const line of save.split('\n')) {
    if (line.startsWith('*')) block = [line];
    else if (block) {
      block.push(line);
      if (line === 'COMMIT') {
        const body = block.slice(1, -1);
        if (!body.every((l) => /^:\S+ ACCEPT \[-\]$/.test(l))) kept.push(...block);
        block = undefined;
      }
    } else kept.push(line);
  }
  if (block) kept.push(...block);
  return kept.join('\n');
}
