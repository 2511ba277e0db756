// veth pairs between lab namespaces (or both ends in one), with addresses
// from the lab ranges only (addresses.ts) and no routes beyond the on-link
// ones the kernel adds: nothing sent there can leave the lab. A veth goes
// away with its namespace, so it needs no cleanup of its own.
import { execFileSync } from 'node:child_process';
import { execa } from 'execa';
import { assertLabAddress } from './addresses.js';

export interface VethEnd {
  ns: string;
  ifname: string;
  v4?: string[];
  v6?: string[];
}

/** The `ip` commands that make the pair; every address is checked before anything is made. */
export function vethCommands(a: VethEnd, b: VethEnd): string[][] {
  for (const e of [a, b]) {
    if (e.ifname.length > 15) throw new Error(`interface name ${e.ifname} is longer than 15 characters (IFNAMSIZ)`);
    for (const x of [...(e.v4 ?? []), ...(e.v6 ?? [])]) assertLabAddress(x);
  }
  const cmds = [a.ns === b.ns
    ? ['-n', a.ns, 'link', 'add', a.ifname, 'type', 'veth', 'peer', 'name', b.ifname]
    : ['link', 'add', a.ifname, 'netns', a.ns, 'type', 'veth', 'peer', 'name', b.ifname, 'netns', b.ns]];
  for (const e of [a, b]) {
    for (const x of e.v4 ?? []) cmds.push(['-n', e.ns, 'addr', 'add', x, 'dev', e.ifname]);
    // nodad: usable at once, the lab owns the whole link
    for (const x of e.v6 ?? []) cmds.push(['-n', e.ns, '-6', 'addr', 'add', x, 'dev', e.ifname, 'nodad']);
    cmds.push(['-n', e.ns, 'link', 'set', e.ifname, 'up']);
  }
  return cmds;
}

export async function addVeth(a: VethEnd, b: VethEnd): Promise<void> {
  for (const c of vethCommands(a, b)) await execa('ip', c);
}

export function addVethSync(a: VethEnd, b: VethEnd): void {
  for (const c of vethCommands(a, b)) execFileSync('ip', c, { stdio: ['ignore', 'ignore', 'pipe'] });
}
