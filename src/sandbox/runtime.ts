// What the sandbox needs from a "container runtime": pods on the chained CNI
// network (creating one runs CNI ADD, deleting it runs DEL) and processes
// inside a pod's network namespace. Two implementations: podman (a real
// runtime, podman.ts) and plain network namespaces driving the same CNI
// chain (netns.ts), for machines where podman cannot be installed.
import { existsSync, readdirSync, rmSync, rmdirSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import type { Proc } from '../lab/process.js';

export interface PodHandle {
  name: string;
  ip: string;
  /** The pod's network namespace path (what CNI_NETNS named). */
  netns: string;
  containerId: string;
}

export interface RunOpts {
  /** run as this uid/gid (the proxy: 1337) */
  uid?: number;
}

export interface Runtime {
  readonly kind: 'podman' | 'netns';
  /** One line for the header: what runs the pods. */
  readonly description: string;
  /** Network config and anything shared by all pods; registers its own cleanup. */
  prepare(signal?: AbortSignal): Promise<void>;
  /** The pod's sandbox on the chained network: CNI ADD runs here. */
  createPod(name: string, signal?: AbortSignal): Promise<PodHandle>;
  /** A process (container) in the pod's network namespace; stdout lines are read by the caller. */
  run(pod: PodHandle, container: string, cmd: string[], o?: RunOpts): Proc;
  /** Stop the pod's processes and remove its sandbox: CNI DEL runs here. Idempotent. */
  deletePod(pod: PodHandle): Promise<void>;
}

/** Where Debian (and most distributions) put the CNI reference plugins. */
export const CNI_PLUGIN_DIRS = ['/usr/lib/cni', '/opt/cni/bin', '/usr/libexec/cni'];

export function cniPluginDirs(): string[] {
  const dirs = CNI_PLUGIN_DIRS.filter((d) => existsSync(path.join(d, 'bridge')) && existsSync(path.join(d, 'host-local')));
  if (dirs.length === 0) {
    throw new Error(`the CNI bridge and host-local plugins are not installed (looked in ${CNI_PLUGIN_DIRS.join(', ')}): apt-get install containernetworking-plugins (npm run setup does)`);
  }
  return dirs;
}

export async function linkExists(name: string): Promise<boolean> {
  return (await execa('ip', ['link', 'show', 'dev', name], { reject: false })).exitCode === 0;
}

/** The bridge plugin creates the bridge on the first ADD and never deletes it. */
export async function deleteBridge(name: string): Promise<void> {
  if (!(await linkExists(name))) return;
  const r = await execa('ip', ['link', 'del', 'dev', name], { reject: false });
  if (r.exitCode !== 0 && (await linkExists(name))) throw new Error(`cannot delete bridge ${name}: ${r.stderr}`);
}

/**
 * libcni caches each attachment's result under /var/lib/cni/results
 * (<network>-<container>-<ifname>) and removes it on DEL; remove what a
 * failed DEL left, and the directories if this run created them.
 */
export const CNI_CACHE = '/var/lib/cni';

export function cniCacheSnapshot(): { existed: boolean; resultsExisted: boolean } {
  return { existed: existsSync(CNI_CACHE), resultsExisted: existsSync(path.join(CNI_CACHE, 'results')) };
}

export function cleanCniCache(network: string, before: { existed: boolean; resultsExisted: boolean }): string[] {
  const removed: string[] = [];
  const results = path.join(CNI_CACHE, 'results');
  if (existsSync(results)) {
    for (const f of readdirSync(results)) {
      if (!f.startsWith(`${network}-`)) continue;
      rmSync(path.join(results, f), { force: true });
      removed.push(path.join(results, f));
    }
    if (!before.resultsExisted && readdirSync(results).length === 0) rmdirSync(results);
  }
  if (!before.existed && existsSync(CNI_CACHE) && readdirSync(CNI_CACHE).length === 0) rmdirSync(CNI_CACHE);
  return removed;
}
