// Drives the agent the way a container runtime does: exec the real
// build/bin/meshcap-cni with CNI env + stdin, read stdout + exit code.
import { randomBytes } from 'node:crypto';
import { closeSync, existsSync, openSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { cniBinary } from '../../../src/paths.js';
import { scaled } from '../../helpers/lab.js';

export interface CniRun {
  exitCode: number;
  stdout: string;
  json: Record<string, unknown> | undefined;
  ms: number;
  /** Why there is no exit code (a signal, a failed exec), when there is none. */
  failure?: string;
}

export function requireCniBinary(): void {
  if (!existsSync(cniBinary)) {
    throw new Error(`${cniBinary} is missing: build it with \`cmake -S native/cni -B build/cni-only -DMESHCAP_BIN_DIR=$PWD/build/bin && cmake --build build/cni-only\``);
  }
}

export interface CniCall {
  socket: string;
  containerId?: string;
  netns?: string;
  ifname?: string;
  namespace?: string;
  pod?: string;
  /** prevResult address of the pod (CIDR). */
  podAddress?: string;
  cniVersion?: string;
  extra?: Record<string, unknown>;
}

export function netConf(c: CniCall): string {
  const conf: Record<string, unknown> = {
    cniVersion: c.cniVersion ?? '1.1.0',
    name: 'meshnet',
    type: 'meshcap-cni',
    agentSocket: c.socket,
    // stretched under emulation like every fixed deadline (a 5.10/6.1 TCG guest
    // at load 15 took longer than 20 s for a first ADD); at most the schema's 600 s
    agentTimeoutMs: Math.min(scaled(20_000), 600_000),
    ...(c.extra ?? {}),
  };
  if (c.podAddress) {
    conf.prevResult = {
      cniVersion: c.cniVersion ?? '1.1.0',
      interfaces: [{ name: 'eth0', sandbox: c.netns ?? '' }],
      ips: [{ address: c.podAddress, interface: 0 }],
    };
  }
  return JSON.stringify(conf);
}

export async function cni(command: string, c: CniCall): Promise<CniRun> {
  const env: Record<string, string> = { CNI_COMMAND: command, CNI_PATH: '/opt/cni/bin' };
  if (c.containerId) env.CNI_CONTAINERID = c.containerId;
  if (c.netns) env.CNI_NETNS = c.netns;
  env.CNI_IFNAME = c.ifname ?? 'eth0';
  if (c.pod) env.CNI_ARGS = `IgnoreUnknown=1;K8S_POD_NAMESPACE=${c.namespace ?? 'default'};K8S_POD_NAME=${c.pod};K8S_POD_INFRA_CONTAINER_ID=${c.containerId ?? ''}`;
  // stdin is a file the child inherits, as a runtime's stdin is written at
  // once: with execa's `input`, node writes it from the event loop, which a
  // burst of 100 spawns on an emulated CPU stalls past the plugin's 5 s
  // stdin deadline before the first write.
  const file = path.join(os.tmpdir(), `meshcap-cni-stdin-${process.pid}-${randomBytes(4).toString('hex')}.json`);
  writeFileSync(file, netConf(c));
  const fd = openSync(file, 'r');
  const t0 = performance.now();
  let r;
  try {
    // execa hands any fd number to spawn; its types list only 0 and 3-9
    r = await execa(cniBinary, [], { env, extendEnv: false, stdin: fd as unknown as 3, reject: false, timeout: scaled(60_000) });
  } finally {
    closeSync(fd);
    rmSync(file, { force: true });
  }
  const ms = performance.now() - t0;
  let json: Record<string, unknown> | undefined;
  try {
    json = JSON.parse(r.stdout) as Record<string, unknown>;
  } catch {
    json = undefined;
  }
  return { exitCode: r.exitCode ?? -1, stdout: r.stdout, json, ms, ...(r.exitCode === undefined ? { failure: `${r.signal ?? ''} ${r.shortMessage ?? ''} ${r.stderr}`.trim() } : {}) };
}
