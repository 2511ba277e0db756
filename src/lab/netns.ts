// Named network namespaces (`ip netns`, so they show under /var/run/netns and
// outlive no one: every caller registers their removal). Async for the
// sandbox, benches and tests; sync variants for callers that must stay
// synchronous (the istio-diff peers, exit handlers).
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { execa } from 'execa';

export const NETNS_DIR = '/var/run/netns';
export const netnsPath = (name: string): string => `${NETNS_DIR}/${name}`;

export interface AddNetnsOpts {
  /** bring lo up (default true: most users bind 127.0.0.1 or the proxy port on it) */
  lo?: boolean;
}

/** Create the namespace (nothing but lo in it, so no route out); returns its path. Half-made namespaces are removed. */
export async function addNetns(name: string, o: AddNetnsOpts = {}): Promise<string> {
  await execa('ip', ['netns', 'add', name]);
  if (o.lo !== false) {
    try {
      await execa('ip', ['-n', name, 'link', 'set', 'lo', 'up']);
    } catch (e) {
      await delNetns(name).catch(() => undefined);
      throw e;
    }
  }
  return netnsPath(name);
}

export function addNetnsSync(name: string, o: AddNetnsOpts = {}): string {
  execFileSync('ip', ['netns', 'add', name], { stdio: ['ignore', 'ignore', 'pipe'] });
  if (o.lo !== false) {
    try {
      execFileSync('ip', ['-n', name, 'link', 'set', 'lo', 'up'], { stdio: ['ignore', 'ignore', 'pipe'] });
    } catch (e) {
      delNetnsSync(name);
      throw e;
    }
  }
  return netnsPath(name);
}

/** Remove the namespace; a namespace already gone is fine, one that stays is an error. */
export async function delNetns(name: string): Promise<void> {
  const r = await execa('ip', ['netns', 'del', name], { reject: false });
  if (r.exitCode !== 0 && existsSync(netnsPath(name))) throw new Error(`ip netns del ${name}: ${r.stderr.trim()}`);
}

/** Best effort (exit handlers): true if it is gone afterwards. */
export function delNetnsSync(name: string): boolean {
  try {
    execFileSync('ip', ['netns', 'del', name], { stdio: 'ignore' });
  } catch {
    /* already gone, or busy: answered below */
  }
  return !existsSync(netnsPath(name));
}

const names = (out: string, prefix: string) => out.split('\n').map((l) => l.split(' ')[0] ?? '').filter((n) => n && n.startsWith(prefix));

/** Namespaces whose name starts with `prefix` (what a crashed run may have left). */
export async function listNetns(prefix: string): Promise<string[]> {
  return names((await execa('ip', ['netns', 'list'])).stdout, prefix);
}

export function listNetnsSync(prefix: string): string[] {
  return names(execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' }), prefix);
}

/** Pids of the processes inside the namespace. */
export async function netnsPids(name: string): Promise<number[]> {
  const r = await execa('ip', ['netns', 'pids', name], { reject: false });
  return r.stdout.split('\n').filter(Boolean).map(Number);
}
