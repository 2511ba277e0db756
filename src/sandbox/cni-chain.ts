// A small libcni for the netns runtime: runs a conflist's plugins in order on
// ADD (each gets the previous result as prevResult) and in reverse on DEL
// (each gets the ADD result, as libcni does from 0.4.0 on), with the CNI
// environment a container runtime sets. The plugins are the real binaries:
// bridge and host-local from containernetworking-plugins, then meshcap-cni.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';

export interface CniRuntimeConf {
  containerId: string;
  netns: string;
  ifname: string;
  /** CNI_ARGS, e.g. "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod" */
  args: string;
  /** Directories searched for plugin binaries (CNI_PATH). */
  paths: string[];
  /** How long one plugin may run before it is killed. */
  timeoutMs: number;
}

export interface ConfList {
  cniVersion: string;
  name: string;
  plugins: Record<string, unknown>[];
}

export class CniPluginError extends Error {
  constructor(readonly plugin: string, readonly command: string, readonly code: number | undefined, msg: string) {
    super(`CNI ${command} failed in plugin ${plugin}${code !== undefined ? ` (code ${code})` : ''}: ${msg}`);
    this.name = 'CniPluginError';
  }
}

export function findPlugin(type: string, paths: string[]): string {
  for (const d of paths) {
    const p = path.join(d, type);
    if (existsSync(p)) return p;
  }
  throw new CniPluginError(type, 'exec', undefined, `no executable ${type} in ${paths.join(':')} (Debian: apt-get install containernetworking-plugins; meshcap-cni: npm run setup)`);
}

async function exec(command: 'ADD' | 'DEL', list: ConfList, plugin: Record<string, unknown>, rt: CniRuntimeConf, prevResult?: unknown): Promise<unknown> {
  const type = String(plugin.type);
  const bin = findPlugin(type, rt.paths);
  const conf = { ...plugin, name: list.name, cniVersion: list.cniVersion, ...(prevResult !== undefined ? { prevResult } : {}) };
  const r = await execa(bin, [], {
    input: JSON.stringify(conf),
    env: {
      CNI_COMMAND: command,
      CNI_CONTAINERID: rt.containerId,
      CNI_NETNS: rt.netns,
      CNI_IFNAME: rt.ifname,
      CNI_ARGS: rt.args,
      CNI_PATH: rt.paths.join(':'),
      PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin',
    },
    extendEnv: false,
    reject: false,
    timeout: rt.timeoutMs,
  });
  if (r.exitCode !== 0) {
    let code: number | undefined;
    let msg = r.stdout || r.stderr || `exit ${r.exitCode ?? r.signal}`;
    try {
      const j = JSON.parse(r.stdout) as { code?: number; msg?: string; details?: string };
      code = j.code;
      msg = [j.msg, j.details].filter(Boolean).join(': ') || msg;
    } catch {
      /* not the CNI error JSON: keep the raw text */
    }
    throw new CniPluginError(type, command, code, msg.trim());
  }
  if (command === 'DEL' || !r.stdout.trim()) return prevResult;
  return JSON.parse(r.stdout);
}

/** ADD through the whole chain; returns the final result. */
export async function chainAdd(list: ConfList, rt: CniRuntimeConf): Promise<Record<string, unknown>> {
  let result: unknown;
  for (const p of list.plugins) result = await exec('ADD', list, p, rt, result);
  return result as Record<string, unknown>;
}

/** DEL through the chain in reverse; every plugin runs even if one fails, and the first failure is thrown. */
export async function chainDel(list: ConfList, rt: CniRuntimeConf, addResult?: unknown): Promise<void> {
  let first: Error | undefined;
  for (const p of [...list.plugins].reverse()) {
    try {
      await exec('DEL', list, p, rt, addResult);
    } catch (e) {
      first ??= e as Error;
    }
  }
  if (first) throw first;
}

/** The first IPv4 address (without prefix) of a CNI 1.x result. */
export function resultIPv4(result: Record<string, unknown>): string {
  const ips = (result.ips ?? []) as { address?: string }[];
  const v4 = ips.map((i) => i.address?.split('/')[0] ?? '').find((a) => /^\d+\.\d+\.\d+\.\d+$/.test(a));
  if (!v4) throw new Error(`the CNI result has no IPv4 address: ${JSON.stringify(result)}`);
  return v4;
}
