// What one sandbox run builds, as plain data: names, addresses, files. Pure,
// so the layout is unit-tested and every other module reads it from here.
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import type { V1Pod } from '@kubernetes/client-node';
import { stringify } from 'yaml';
import type { Mode } from '../loader/mode.js';
import { AGENT_TIMEOUT_MAX_MS } from '../cni/rules.js';
import { ISTIO_ANNOTATIONS, ISTIO_PROXY_CONTAINER } from '../mesh/vocabulary.js';
import { cniBinary } from '../paths.js';

export type PodRole = 'meshed' | 'unmeshed' | 'server';

export interface SandboxPod {
  name: string;
  role: PodRole;
}

export interface SandboxPlan {
  /** 6 hex digits; every name this run creates carries it. */
  id: string;
  namespace: string;
  /** All files of the run (podman storage, configs, agent state); removed at the end. */
  runDir: string;
  /** The host bridge the bridge plugin creates (≤ 15 bytes). */
  bridge: string;
  /** CNI network name. */
  network: string;
  /** /24 from 198.18.0.0/15; the bridge has no host address, so it exists only inside the pods. */
  subnet: string;
  socket: string;
  podsFile: string;
  pods: SandboxPod[];
  serverPorts: number[];
  /** Connections each client pod makes per mode (bounded). */
  connections: number;
  intervalMs: number;
  /** How long the agent, each sidecar and the server may take to start. */
  startupTimeoutMs: number;
  /** Every other deadline of the run, stretched with startupTimeoutMs (deadlinesFor). */
  deadlines: SandboxDeadlines;
  proxyUid: number;
}

/** The run's fixed deadlines, in ms. */
export interface SandboxDeadlines {
  /** meshcap-cni's agentTimeoutMs: one ADD/DEL answered by the agent. */
  cniAgent: number;
  /** One CNI plugin exec (netns runtime); it includes meshcap-cni's wait for the agent. */
  cniPlugin: number;
  /** One podman command; `podman run` includes the whole CNI ADD. */
  podman: number;
  /** One client connection: connect, the server's answer. */
  connection: number;
}

/** The default --startup-timeout-ms, the one the deadlines below are sized for. */
export const STARTUP_TIMEOUT_MS = 60_000;

/**
 * The deadlines for a machine that needs startupTimeoutMs to start a process:
 * a caller who stretches the startup deadline says the machine is that much
 * slower (an emulated or overloaded one), and a CNI ADD or a podman command
 * is as slow there as a start. The kernel matrix's TCG guests at load 15 took
 * over 20 s for one ADD (docs/kernels.md), twice the default agentTimeoutMs.
 * Never shorter than the defaults, and agentTimeoutMs within meshcap-cni's limit.
 */
export function deadlinesFor(startupTimeoutMs: number): SandboxDeadlines {
  const k = Math.max(1, startupTimeoutMs / STARTUP_TIMEOUT_MS);
  return {
    cniAgent: Math.min(AGENT_TIMEOUT_MAX_MS, Math.ceil(10_000 * k)),
    cniPlugin: Math.ceil(30_000 * k),
    podman: Math.ceil(60_000 * k),
    connection: Math.ceil(3_000 * k),
  };
}

export const SANDBOX_RUN_ROOT = '/run/meshcap-sandbox';
export const SANDBOX_NAMESPACE = 'meshcap-sandbox';
export const PIN_PREFIX = '/sys/fs/bpf/meshcap-sandbox-';

export interface PlanOptions {
  id?: string;
  meshed?: number;
  connections?: number;
  intervalMs?: number;
  startupTimeoutMs?: number;
  runRoot?: string;
}

export function makePlan(o: PlanOptions = {}): SandboxPlan {
  const id = o.id ?? randomBytes(3).toString('hex');
  if (!/^[0-9a-f]{6}$/.test(id)) throw new Error(`sandbox run id ${id} is not 6 hex digits`);
  const meshed = o.meshed ?? 3;
  if (!Number.isInteger(meshed) || meshed < 1 || meshed > 20) throw new Error(`--meshed ${meshed}: 1..20 meshed pods`);
  const connections = o.connections ?? 60;
  if (!Number.isInteger(connections) || connections < 1 || connections > 10_000) throw new Error(`--connections ${connections}: 1..10000 per pod`);
  const intervalMs = o.intervalMs ?? 100;
  if (!Number.isInteger(intervalMs) || intervalMs < 0 || intervalMs > 10_000) throw new Error(`--interval-ms ${intervalMs}: 0..10000`);
  const startupTimeoutMs = o.startupTimeoutMs ?? STARTUP_TIMEOUT_MS;
  if (!Number.isInteger(startupTimeoutMs) || startupTimeoutMs < 1000 || startupTimeoutMs > 3_600_000) throw new Error(`--startup-timeout-ms ${startupTimeoutMs}: 1000..3600000`);
  const runDir = path.join(o.runRoot ?? SANDBOX_RUN_ROOT, id);
  // 198.19.N.0/24: the upper half of the benchmark range, N from the id, so
  // two concurrent runs are unlikely to share numbers (harmless if they do:
  // separate bridges, no host addresses).
  const third = parseInt(id.slice(0, 2), 16);
  return {
    id,
    namespace: SANDBOX_NAMESPACE,
    runDir,
    bridge: `mcsb${id}`,
    network: `meshcap-sandbox-${id}`,
    subnet: `198.19.${third}.0/24`,
    socket: path.join(runDir, 'cni.sock'),
    podsFile: path.join(runDir, 'pods.yaml'),
    pods: [
      { name: 'server', role: 'server' },
      ...Array.from({ length: meshed }, (_, i) => ({ name: `meshed-${i + 1}`, role: 'meshed' as const })),
      { name: 'unmeshed', role: 'unmeshed' },
    ],
    serverPorts: [8080, 9090],
    connections,
    intervalMs,
    startupTimeoutMs,
    deadlines: deadlinesFor(startupTimeoutMs),
    proxyUid: 1337,
  };
}

export const pinRootOf = (plan: SandboxPlan, mode: Mode) => `${PIN_PREFIX}${plan.id}-${mode}`;
export const stateDirOf = (plan: SandboxPlan, mode: Mode) => path.join(plan.runDir, `agent-state-${mode}`);
export const clientPods = (plan: SandboxPlan) => plan.pods.filter((p) => p.role !== 'server');

/**
 * The Pod objects the standalone agent reads. A meshed pod looks exactly like
 * what Istio's injector produces (istio-proxy container + the
 * sidecar.istio.io/status annotation), so the agent's decision is Istio's
 * meshed-pod test, not a sandbox shortcut. The others are plain pods.
 */
export function podManifests(plan: SandboxPlan): V1Pod[] {
  return plan.pods.map((p) => {
    const pod: V1Pod = {
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: { name: p.name, namespace: plan.namespace, labels: { app: p.role === 'server' ? 'server' : 'client', 'meshcap.dev/sandbox': plan.id } },
      spec: { containers: [{ name: p.role === 'server' ? 'server' : 'app', image: 'local-rootfs' }] },
    };
    if (p.role === 'meshed') {
      pod.metadata!.annotations = {
        [ISTIO_ANNOTATIONS.status]: JSON.stringify({ initContainers: null, containers: [ISTIO_PROXY_CONTAINER], volumes: ['istio-envoy'], imagePullSecrets: null }),
      };
      pod.spec!.containers.push({ name: ISTIO_PROXY_CONTAINER, image: 'local-rootfs', securityContext: { runAsUser: plan.proxyUid, runAsGroup: plan.proxyUid } });
    }
    return pod;
  });
}

export function podsYaml(plan: SandboxPlan): string {
  return podManifests(plan).map((p) => stringify(p)).join('---\n');
}

/**
 * The chained CNI network: bridge + host-local, then meshcap-cni. No gateway,
 * no masquerade, no routes: the bridge gets no host address and the pods reach
 * only each other, so no host iptables rule is made and no packet can leave.
 */
export function conflist(plan: SandboxPlan): Record<string, unknown> {
  return {
    cniVersion: '1.0.0',
    name: plan.network,
    plugins: [
      {
        type: 'bridge',
        bridge: plan.bridge,
        isGateway: false,
        ipMasq: false,
        ipam: { type: 'host-local', dataDir: path.join(plan.runDir, 'ipam'), ranges: [[{ subnet: plan.subnet }]] },
      },
      { type: 'meshcap-cni', agentSocket: plan.socket, agentTimeoutMs: plan.deadlines.cniAgent },
    ],
  };
}

/**
 * A private containers.conf (podman reads only this one when CONTAINERS_CONF
 * names it), so the host's podman configuration is never changed. Every path
 * podman writes is under the run dir; runc because crun fails on hybrid
 * cgroups; file locks instead of the host-wide /dev/shm/libpod_lock.
 */
export function containersConf(plan: SandboxPlan, cniPluginDirs: string[]): string {
  const q = (s: string) => JSON.stringify(s);
  return [
    '# written by meshcap sandbox for one run; removed with it',
    '[containers]',
    'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]',
    '[network]',
    'network_backend = "cni"',
    `network_config_dir = ${q(path.join(plan.runDir, 'net.d'))}`,
    `cni_plugin_dirs = [${[...cniPluginDirs, path.dirname(cniBinary)].map(q).join(', ')}]`,
    '[engine]',
    'runtime = "runc"',
    'cgroup_manager = "cgroupfs"',
    'events_logger = "file"',
    `events_logfile_path = ${q(path.join(plan.runDir, 'podman-events.log'))}`,
    `tmp_dir = ${q(path.join(plan.runDir, 'podman-tmp'))}`,
    'lock_type = "file"',
    '',
  ].join('\n');
}
