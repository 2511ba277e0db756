// npm run bench:scale — one node filling up with meshed eBPF pods: CNI ADD
// latency (exec of build/bin/meshcap-cni to its exit, and the agent's own
// durationMs for the same request) with 10, 1,000 and 10,000 pods already
// registered; the agent's RSS at each size; `meshcap status` over all of
// them; and the agent's cold start adopting what is pinned (SIGTERM, then a
// new agent on the same state dir and pin root), timed from spawn to its
// "ready" line.
//
//   node --import ./bench/lib/ts.mjs bench/scale/main.ts [--sizes 10,1000,10000] [--sample 200] [--warmup 200] [--restart-at 1000,10000] [--drain yes|no] [--exec launcher|node] [--source file|api] [--peak-trace] [--listen [--listen-workers N] [--listen-entries N]] [--json FILE] [--plot FILE.svg]
//   ... bench/scale/main.ts --plot-only FILE.json --plot FILE.svg   (redraw from a stored run)
//
// Needs root and the build (npm run build). The agent is the real one: by
// default standalone (bin/meshcap agent --standalone, a pods file), as in
// bench:cni; with --source api it watches a real kube-apiserver (etcd and
// kube-apiserver from build/k8s, npm run build:k8s) as the DaemonSet's agent
// does, and the pods are created there as Istio's injector leaves them
// (istio-pod.ts), so the agent lists and watches pods of a real mesh's size.
//
// Ten thousand network namespaces are ten thousand bind mounts: the bench
// runs itself in a private mount namespace (unshare --mount) with its own
// tmpfs on /var/run/netns, so none of them is visible to the rest of the
// machine, and they all go when the bench and its agent exit, however they
// exit. The namespaces have only lo (down): nothing leaves them. The outer
// process removes the pin root and stops the agent if the inner one did not.
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { daemonSetAgentEnv } from '../../test/helpers/agent-process.js';
import { parseOptions } from '../../scripts/lib/cli-options.mjs';
import { Launcher, runNode, type ExecResult } from '../cni/launcher.js';
import { PeakTrace, peakTraceText } from './peak-trace.js';
import { PodListeners } from './pod-listeners.js';
import { MC_LISTEN_SLOTS } from '../../src/maps/layout.js';
import { listenerFill } from '../../src/pod-datapath/ebpf-listeners.js';
import { plotScale, type ScaleBenchData } from './plot.js';
import { istioPod } from './istio-pod.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const CNI = path.join(root, 'build/bin/meshcap-cni');
const MESHCAP = path.join(root, 'bin/meshcap');

const opt = parseOptions(import.meta.url, 'bench:scale', {
  sizes: { type: 'string', default: '10,1000,10000' },
  sample: { type: 'string', default: '200' },
  // unrecorded ADD+DEL pairs before each size's sample: every row measures a warmed agent
  warmup: { type: 'string', default: '200' },
  'restart-at': { type: 'string', default: '1000,10000' },
  // after the last size, DEL the pods down to the first size and sample it
  // again: the growth figure then compares the largest row with both ends
  // of the run, so a machine that drifts during the run does not read as
  // growth (default on; --drain no to skip)
  drain: { type: 'string', default: 'yes' },
  // who execs the plugin: the native launcher, as a runtime (default), or this Node process (runs before 2026-11-25 evening)
  exec: { type: 'string', default: 'launcher' },
  concurrency: { type: 'string', default: '16' },
  // `meshcap status` runs per size (the row shows their median: one run of
  // ~1 s read ±10% between runs on this host)
  'status-runs': { type: 'string', default: '3' },
  // another build's bin/meshcap, its status run alternated with this one's
  // at each size (an A/B of status in one run, same pods, same minutes)
  'status-alt': { type: 'string' },
  // default: the DaemonSet's NODE_OPTIONS (deploy/meshcap.yaml); '' measures without
  'agent-node-options': { type: 'string' },
  // sizes after which the agent is watched for one self-check period (default: the last size; '' none)
  'watch-self-check': { type: 'string' },
  // the agent's VmHWM read every ~1 ms: in which phase its peak was set (peak-trace.ts)
  'peak-trace': { type: 'boolean', default: false },
  // each registered pod gets its sidecar's listening sockets (pod-listeners.ts): mc_listen fills as on a node of real proxies
  listen: { type: 'boolean', default: false },
  // with --listen: sockets per listener, SO_REUSEPORT (Envoy opens one per worker; Istio's sidecars run 2). At most
  // MC_LISTEN_SLOTS: mc_listen registers that many per listener, so more would not be in it by design
  'listen-workers': { type: 'string', default: '1' },
  // the agent's --listen-entries (mc_listen's size; the bench's pin root is fresh, so the agent creates it): default the agent's
  'listen-entries': { type: 'string' },
  // where the agent's pods come from: a pods file (--standalone) or a real kube-apiserver (the DaemonSet's way)
  source: { type: 'string', default: 'file' },
  json: { type: 'string' },
  plot: { type: 'string' },
  'plot-only': { type: 'string' },
});
if (opt['plot-only']) {
  if (!opt.plot) throw new Error('--plot-only FILE.json needs --plot FILE.svg');
  plotScale(JSON.parse(readFileSync(opt['plot-only'], 'utf8')) as ScaleBenchData, opt.plot);
  process.exit(0);
}
if (opt.plot) {
  try {
    execFileSync('sh', ['-c', 'command -v gnuplot'], { stdio: 'ignore' });
  } catch {
    throw new Error('--plot needs gnuplot: run npm run setup (package gnuplot-nox)');
  }
}
const SIZES = opt.sizes.split(',').map(Number);
const SAMPLE = Number(opt.sample);
const WARMUP = Number(opt.warmup);
const RESTART_AT = new Set(opt['restart-at'].split(',').filter(Boolean).map(Number));
const CONC = Number(opt.concurrency);
const STATUS_RUNS = Number(opt['status-runs']);
if (!Number.isInteger(STATUS_RUNS) || STATUS_RUNS < 1) throw new Error('--status-runs: a whole number, 1 or more');
const STATUS_ALT = opt['status-alt'] ? path.resolve(opt['status-alt']) : undefined;
if (STATUS_ALT && !existsSync(STATUS_ALT)) throw new Error(`--status-alt ${STATUS_ALT}: no such file (another build's bin/meshcap)`);
if (!['yes', 'no'].includes(opt.drain)) throw new Error('--drain: yes or no');
if (!['launcher', 'node'].includes(opt.exec)) throw new Error('--exec: launcher or node');
if (!['file', 'api'].includes(opt.source)) throw new Error('--source: file or api');
const API = opt.source === 'api';
const DRAIN = opt.drain === 'yes' && SIZES.length > 1;
/** The agent's self-check period (its default --self-check-interval): a watch this long holds one pass. */
const SELF_CHECK_MS = 30_000;
const agentEnv = daemonSetAgentEnv();
if (opt['agent-node-options'] !== undefined) agentEnv.NODE_OPTIONS = opt['agent-node-options'];
// the agent's own switches for comparisons (MESHCAP_AGENT_MALLOC_TRIM=0, MESHCAP_AGENT_OPTIMIZE_FOR_SIZE=0) reach it from this
// process's environment: named in the output so a run says what it measured
const WATCH_AT = new Set((opt['watch-self-check'] ?? opt.sizes.split(',').at(-1)!).split(',').filter(Boolean).map(Number));
const agentSwitches = Object.fromEntries(Object.entries(process.env).filter(([k]) => k.startsWith('MESHCAP_AGENT_'))) as Record<string, string>;
if (!SIZES.every((n, i) => Number.isInteger(n) && n >= 1 && n <= 16_000 && (i === 0 || n > SIZES[i - 1]!))) throw new Error('--sizes: increasing pod counts, at most 16,000 (mc_pods holds 16,384)');
if (!(SAMPLE >= 1 && CONC >= 1)) throw new Error('--sample and --concurrency must be positive');
if (!(Number.isInteger(WARMUP) && WARMUP >= 0)) throw new Error('--warmup: a number of ADD+DEL pairs, 0 or more');
if (process.getuid?.() !== 0) throw new Error('run as root: the bench makes network namespaces and loads BPF programs');
for (const f of [CNI, path.join(root, 'dist/cli/main.js')]) if (!existsSync(f)) throw new Error(`${f} is missing: npm run build`);

/** Network namespaces the kernel holds, live or dying (the net_namespace slab's active objects); undefined where slabinfo does not show it. */
function netnsObjects(): number | undefined {
  try {
    const line = readFileSync('/proc/slabinfo', 'utf8').split('\n').find((l) => l.startsWith('net_namespace '));
    return line === undefined ? undefined : Number(line.split(/\s+/)[1]);
  } catch {
    return undefined;
  }
}

/**
 * Waits until the kernel has freed the network namespaces of an earlier run.
 * Ten thousand namespaces left with the bench's mount namespace stay queued
 * until the next namespace is made or removed; then the kernel's cleanup
 * takes both CPUs (load 15-18). A run that began then measured the cleanup in
 * its first rows. So a namespace is made and removed to start it, again every
 * 2 s, until the count is back to `target` or stops falling (at most 3 min).
 * Returns the count left.
 */
function awaitNetnsTeardown(when: string, target = 0): number | undefined {
  const before = netnsObjects();
  if (before === undefined) {
    console.error(`bench:scale: ${when}: /proc/slabinfo shows no net_namespace count; not waiting for the kernel's namespace cleanup`);
    return undefined;
  }
  const kick = `meshcap-scale-kick-${process.pid}`;
  const t0 = performance.now();
  let last = before;
  let still = 0;
  while (performance.now() - t0 < 180_000) {
    spawnSync('ip', ['netns', 'add', kick]);
    spawnSync('ip', ['netns', 'del', kick]);
    spawnSync('sleep', ['2']);
    const n = netnsObjects() ?? 0;
    still = n < last - 10 ? 0 : still + 1;
    last = n;
    if (n <= target + 100 || still >= 2) break;
  }
  if (before - last > 100) console.error(`bench:scale: ${when}: the kernel freed ${before - last} network namespaces in ${((performance.now() - t0) / 1000).toFixed(1)} s (${last} left)`);
  return last;
}

// ---- outer: a private mount namespace for the inner run, and a backstop cleanup
if (process.env.MESHCAP_SCALE_INNER === undefined) {
  const pinRoot = `/sys/fs/bpf/meshcap-scale-${process.pid}`;
  const pidFile = path.join(os.tmpdir(), `meshcap-scale-${process.pid}.agent`);
  // the inner run mounts a tmpfs on it, seen by the inner run only: here it stays an empty directory
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-scale-'));
  const base = awaitNetnsTeardown('before the run');
  // A Ctrl-C or a kill of both (pkill -f) ends the inner run, which cleans up
  // what it can; this process must live on to do the rest (an agent left
  // running, programs attached at the cgroup root under the pin root). The
  // handlers only keep the default action (exit) away: they run once the inner
  // run has ended, and the exit code is the inner run's.
  for (const s of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(s, () => undefined);
  const r = spawnSync('unshare', ['--mount', '--propagation', 'private', process.execPath, ...process.execArgv, ...process.argv.slice(1)], {
    stdio: 'inherit', env: { ...process.env, MESHCAP_SCALE_INNER: pinRoot, MESHCAP_SCALE_PIDFILE: pidFile, MESHCAP_SCALE_TMP: tmp },
  });
  rmSync(tmp, { recursive: true, force: true });
  // The agent is the inner run's child: a killed inner run leaves it running.
  try {
    const pid = Number(readFileSync(pidFile, 'utf8'));
    if (pid > 0 && existsSync(`/proc/${pid}`) && readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(pinRoot)) process.kill(pid, 'SIGKILL');
  } catch { /* no agent recorded, or gone */ }
  rmSync(pidFile, { force: true });
  if (existsSync(pinRoot)) execFileSync(process.execPath, [MESHCAP, 'uninstall', '--force', '--pin-root', pinRoot], { stdio: 'ignore' });
  // the run's namespaces gone before the next thing on this machine is measured
  awaitNetnsTeardown('after the run', base);
  process.exit(r.status ?? 1);
}

// ---- inner
const pinRoot = process.env.MESHCAP_SCALE_INNER;
const pidFile = process.env.MESHCAP_SCALE_PIDFILE!;
const NETNS_DIR = '/var/run/netns';
mkdirSync(NETNS_DIR, { recursive: true });
execFileSync('mount', ['-t', 'tmpfs', '-o', 'mode=755', 'meshcap-scale', NETNS_DIR]);
// Socket, state records and pods file on a tmpfs of this mount namespace's
// own, as the DaemonSet's agent has them (/var/run/meshcap; /run is a tmpfs
// on a node, not on every machine: here it is the root ext4). Until
// 2026-11-25 they were on /tmp's ext4, where each ADD's new record file cost
// ext4's inode allocator a scan past recently deleted inodes (perf:
// recently_deleted, find_inode_bit): most of the agent's CPU per ADD in
// the small rows, after a run of DELs most of all (docs/bench-scale.md, round 8).
const tmp = process.env.MESHCAP_SCALE_TMP!;
execFileSync('mount', ['-t', 'tmpfs', '-o', 'mode=700', 'meshcap-scale-state', tmp]);
const socket = path.join(tmp, 'cni.sock');
const stateDir = path.join(tmp, 'state');
const maxPods = SIZES.at(-1)!;
const nsPath = (i: number) => `${NETNS_DIR}/p${i}`;
const probePath = (i: number) => `${NETNS_DIR}/q${i}`;

let agent: ChildProcess | undefined;
/** mc_listen's keys now (one per listening socket the node's sockops registered). */
const listenKeys = (): number => listenerFill(pinRoot)?.entries ?? 0;
const trace = opt['peak-trace'] ? new PeakTrace() : undefined;
// Istio's defaults: the pods carry no port annotations
const LISTEN_WORKERS = Number(opt['listen-workers']);
if (!Number.isInteger(LISTEN_WORKERS) || LISTEN_WORKERS < 1 || LISTEN_WORKERS > MC_LISTEN_SLOTS) {
  throw new Error(`--listen-workers ${JSON.stringify(opt['listen-workers'])}: 1..${MC_LISTEN_SLOTS} (mc_listen registers at most ${MC_LISTEN_SLOTS} sockets per listener)`);
}
if (LISTEN_WORKERS > 1 && !opt.listen) throw new Error('--listen-workers needs --listen');
const listeners = opt.listen ? new PodListeners(15006, 15001, LISTEN_WORKERS) : undefined;
const stopAgent = async (signal: NodeJS.Signals = 'SIGTERM') => {
  const a = agent;
  agent = undefined;
  if (!a || a.exitCode !== null) return;
  const exited = new Promise((res) => a.once('exit', res));
  a.kill(signal);
  await exited;
};
function cleanup() {
  if (agent && agent.exitCode === null) agent.kill('SIGKILL');
  void controlPlane?.stop();
  void launcher?.close();
  trace?.close();
  listeners?.close();
  // tmp's tmpfs, the pin root and the namespaces: the mount namespace's end and the outer process
}
process.once('SIGINT', () => { cleanup(); process.exit(130); });
process.once('SIGTERM', () => { cleanup(); process.exit(143); });

const pod = (name: string) => ({
  apiVersion: 'v1',
  kind: 'Pod',
  metadata: { name, namespace: 'bench', annotations: { 'sidecar.istio.io/status': '{"containers":["istio-proxy"]}' } },
  spec: { containers: [{ name: 'app', image: 'app' }, { name: 'istio-proxy', image: 'proxyv2' }] },
});

/**
 * The pods file holds the node's pods: the registered ones and the sample's,
 * as JSON, as an API server's list for this node would (the agent follows the
 * file; a YAML file of 10,000 pods would time the YAML parser instead).
 */
function writePods(n: number): void {
  const f = path.join(tmp, 'pods.json');
  const items = [...Array.from({ length: n }, (_, i) => pod(`p${i}`)), ...Array.from({ length: SAMPLE }, (_, i) => pod(`q${i}`))];
  writeFileSync(`${f}.tmp`, JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
  execFileSync('mv', [`${f}.tmp`, f]);
}

// --source api: a private control plane (test/helpers/k8s-control-plane.ts),
// the node's pods created and deleted there; the agent reads them with the
// admin kubeconfig (authorization is not what is measured).
const API_NODE = 'bench-node';
let controlPlane: import('../../test/helpers/k8s-control-plane.js').ControlPlane | undefined;
let core: import('@kubernetes/client-node').CoreV1Api | undefined;
const apiPods = new Set<string>();
let apiPodBytes = 0;
const kubeconfigFile = path.join(tmp, 'kubeconfig');

async function startControlPlane(): Promise<void> {
  // ControlPlane.start() names the missing binaries and the build step when build/k8s has none
  const { ControlPlane } = await import('../../test/helpers/k8s-control-plane.js');
  const { CoreV1Api } = await import('@kubernetes/client-node');
  const t0 = performance.now();
  controlPlane = await ControlPlane.start();
  const cp = controlPlane;
  cp.writeAdminKubeconfig(kubeconfigFile);
  core = cp.adminKubeConfig().makeApiClient(CoreV1Api);
  await cp.createNamespace('bench');
  log(`control plane up in ${((performance.now() - t0) / 1000).toFixed(1)} s (etcd + kube-apiserver, ${cp.apiserverUrl})`);
}

/** The API server holds p0..p(n-1) and the sample's pods, as the pods file would. */
async function syncApiPods(n: number): Promise<void> {
  const want = [...Array.from({ length: n }, (_, i) => `p${i}`), ...Array.from({ length: SAMPLE }, (_, i) => `q${i}`)];
  const wanted = new Set(want);
  const create = want.filter((name) => !apiPods.has(name));
  const remove = [...apiPods].filter((name) => !wanted.has(name));
  const t0 = performance.now();
  await pool(create.length, CONC, async (k) => {
    const name = create[k]!;
    await core!.createNamespacedPod({ namespace: 'bench', body: istioPod(name, 'bench', API_NODE) as import('@kubernetes/client-node').V1Pod });
    apiPods.add(name);
  });
  // no kubelet finishes a graceful deletion here: grace period 0 removes the object at once
  await pool(remove.length, CONC, async (k) => {
    const name = remove[k]!;
    await core!.deleteNamespacedPod({ namespace: 'bench', name, gracePeriodSeconds: 0 });
    apiPods.delete(name);
  });
  // one pod's JSON as the API server answers it (defaults and managedFields added)
  if (!apiPodBytes) apiPodBytes = (await controlPlane!.adminGet('/api/v1/namespaces/bench/pods/q0')).length;
  if (create.length + remove.length > 0) log(`API server: ${create.length} pods created, ${remove.length} deleted in ${((performance.now() - t0) / 1000).toFixed(1)} s (${apiPods.size} on ${API_NODE})`);
}

const setPods = (n: number): Promise<void> => (API ? syncApiPods(n) : Promise.resolve(writePods(n)));

const ipOf = (i: number) => `198.18.${(i >> 8) & 255}.${i & 255}`;
const probeIp = (i: number) => `198.19.${(i >> 8) & 255}.${i & 255}`;

// The plugin is exec'd as a container runtime does it (bench/cni's native
// launcher: posix_spawn, timed to the child's exit). Until 2026-11-25 the
// bench's own Node process spawned it: libuv fork()s the whole process, ~1.5
// ms of each ADD here, growing with the bench's RSS (~0.45 ms per 100 MB),
// which grows with the pods it tracks: part of the "growth" was the bench's.
// --exec node keeps that for comparison with earlier runs.
let launcher: Launcher | undefined;
function runCni(command: string, container: string, pod: string, ns: string, ip: string): Promise<ExecResult> {
  const env = { CNI_COMMAND: command, CNI_CONTAINERID: container, CNI_NETNS: ns, CNI_IFNAME: 'eth0', CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=${pod}`, CNI_PATH: '/opt/cni/bin' };
  const stdin = JSON.stringify({
    cniVersion: '1.0.0', name: 'bench', type: 'meshcap-cni', agentSocket: socket, agentTimeoutMs: 30000,
    prevResult: { cniVersion: '1.0.0', interfaces: [{ name: 'eth0', sandbox: ns }], ips: [{ address: `${ip}/15`, interface: 0 }] },
  });
  if (opt.exec === 'node') return runNode(CNI, env, stdin);
  launcher ??= new Launcher();
  return launcher.run(CNI, env, stdin);
}

async function pool<T>(n: number, width: number, fn: (i: number) => Promise<T>): Promise<T[]> {
  const out: T[] = new Array(n);
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(width, n) }, async () => {
    while (next < n) {
      const i = next++;
      out[i] = await fn(i);
    }
  }));
  return out;
}

/** The agent's per-request durationMs, by container id, while recording. */
const agentMs = new Map<string, number>();
let readyLine: ((l: Record<string, unknown>) => void) | undefined;
/** The agent's last 'start-up settled' line (its full GCs after the start) and its VmHWM then. */
interface Settled { sinceReadyMs: number; gcMs: number[]; rssMiB: number; peakMiB: number }
let lastSettled: Settled | undefined;
/** The agent's self-check passes that found something (its 'self-check repaired drift' lines): a full mc_listen shows here. */
const driftPasses: { restored: number; dropped: number; notRestored: number; ms: number }[] = [];

async function startAgentProcess(): Promise<{ wallMs: number; ready: Record<string, unknown> }> {
  const t0 = performance.now();
  lastSettled = undefined;
  // the environment the DaemonSet gives the agent (its literal env values in
  // deploy/meshcap.yaml): its RSS is measured as deployed
  const env = { ...process.env, ...agentEnv };
  const source = API ? ['--kubeconfig', kubeconfigFile, '--node-name', API_NODE] : ['--standalone', '--pods', path.join(tmp, 'pods.json')];
  const a = spawn(process.execPath, [MESHCAP, 'agent', ...source, '--socket', socket,
    '--pin-root', pinRoot, '--mode', 'ebpf', '--state-dir', stateDir, '--exclude-namespaces', 'kube-system',
    ...(opt['listen-entries'] ? ['--listen-entries', opt['listen-entries']] : [])], { stdio: ['ignore', 'pipe', 'pipe'], env });
  agent = a;
  writeFileSync(pidFile, String(a.pid));
  trace?.track(a.pid!);
  let err = '';
  a.stderr!.on('data', (d) => { err += d; });
  let buf = '';
  const ready = new Promise<Record<string, unknown>>((resolve, reject) => {
    readyLine = resolve;
    a.once('exit', (code) => reject(new Error(`agent exited (${code}): ${err.slice(-2000)}`)));
  });
  a.stdout!.on('data', (d: Buffer) => {
    buf += d.toString();
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (!line.startsWith('{')) continue;
      const l = JSON.parse(line) as Record<string, unknown>;
      if (l.msg === 'cni request' && typeof l.containerId === 'string' && typeof l.durationMs === 'number') agentMs.set(`${l.verb as string}:${l.containerId}`, l.durationMs);
      else if (l.msg === 'meshcap agent ready') readyLine?.(l);
      else if (l.msg === 'self-check repaired drift') {
        const d = { restored: Number(l.restored), dropped: Number(l.dropped), notRestored: Number(l.notRestored), ms: Number(l.ms) };
        driftPasses.push(d);
        log(`agent self-check: ${d.restored} restored, ${d.dropped} dropped, ${d.notRestored} NOT restored (${d.ms} ms)`);
      }
      else if (l.msg === 'start-up settled: its garbage collected') {
        lastSettled = { sinceReadyMs: Number(l.sinceReadyMs), gcMs: l.gcMs as number[], rssMiB: Number(l.rssMiB), peakMiB: memOf(a.pid!).peak };
        log(`agent's start-up settled ${String(l.sinceReadyMs)} ms after ready: full GCs ${JSON.stringify(l.gcMs)} ms, then RSS ${String(l.rssMiB)} MiB (its peak so far ${lastSettled.peakMiB.toFixed(1)}), V8 heap ${String(l.heapUsedMiB)} of ${String(l.heapTotalMiB)} MiB used, external ${String(l.externalMiB)} MiB`);
      }
      else if ((l.level as number) >= 40) process.stderr.write(`agent: ${line}\n`);
    }
  });
  const r = await ready;
  return { wallMs: performance.now() - t0, ready: r };
}

/** CPU time of this process's reaped children (/proc/self/stat cutime + cstime), ms. */
function childCpuMs(): number {
  const f = readFileSync('/proc/self/stat', 'utf8').split(') ')[1]!.split(' ');
  return (Number(f[13]) + Number(f[14])) * (1000 / 100); // USER_HZ: 100 on Linux
}

/** The agent's resident memory, MiB: all of it, anonymous (heaps, stacks) and file-backed (the node binary and libraries, shared and clean), and the peak. */
interface Mem { rss: number; anon: number; file: number; peak: number }
function memOf(pid: number): Mem {
  const st = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (k: string) => Number(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm').exec(st)?.[1] ?? NaN) / 1024;
  const m = { rss: kb('VmRSS'), anon: kb('RssAnon'), file: kb('RssFile') + kb('RssShmem'), peak: kb('VmHWM') };
  return m;
}
const memText = (m: Mem) => `${m.rss.toFixed(1)} MiB (${(m.rss * 1.048576).toFixed(1)} MB; anon ${m.anon.toFixed(1)}, file ${m.file.toFixed(1)}, peak ${m.peak.toFixed(1)})`;

/** CPU time of a process so far (/proc/PID/stat utime + stime), ms. */
function cpuMsOf(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(f[11]) + Number(f[12])) * (1000 / 100); // USER_HZ: 100 on Linux
}

/**
 * The agent's RSS over one self-check period with nothing else asked of it
 * (VmRSS every 20 ms): at rest (the lowest reading) and its peak (a pass
 * over every pod runs once in the window), and the agent's CPU in the window
 * (the pass's, as the agent is otherwise idle; 10 ms ticks).
 */
interface SelfCheckWatch { ms: number; samples: number; restMiB: number; peakMiB: number; peakAnonMiB: number; cpuMs: number; hwmMiB: number; loadavg: number[] }
async function watchSelfCheck(pid: number): Promise<SelfCheckWatch> {
  const loadavg = os.loadavg();
  const c0 = cpuMsOf(pid);
  const t0 = performance.now();
  let rest = Infinity;
  let peak = 0;
  let peakAnon = 0;
  let samples = 0;
  // a little over the period: the pass that starts in it ends in it
  while (performance.now() - t0 < SELF_CHECK_MS + 3000) {
    const m = memOf(pid);
    rest = Math.min(rest, m.rss);
    if (m.rss > peak) {
      peak = m.rss;
      peakAnon = m.anon;
    }
    samples++;
    await new Promise((r) => setTimeout(r, 20));
  }
  return { ms: performance.now() - t0, samples, restMiB: rest, peakMiB: peak, peakAnonMiB: peakAnon, cpuMs: cpuMsOf(pid) - c0, hwmMiB: memOf(pid).peak, loadavg };
}

const pct = (s: number[], p: number) => s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)]!;
function summary(ms: number[]) {
  const s = [...ms].sort((a, b) => a - b);
  return { n: s.length, p50: pct(s, 50), p90: pct(s, 90), p99: pct(s, 99), max: s.at(-1)! };
}

/** One sampled row (sampleAt). */
interface Sample {
  pods: number;
  loadavg: number[];
  addExecToExit: ReturnType<typeof summary>;
  addAgent: ReturnType<typeof summary>;
  /** the agent's CPU (utime + stime, 10 ms ticks) over the sampled ADDs, per ADD */
  addAgentCpuUs: number;
  /** every sampled ADD's exec-to-exit time, ms (the distribution in the plot) */
  addSamplesMs: number[];
  delExecToExit: ReturnType<typeof summary>;
  agentRssMiB: number;
  agentMem: Mem;
  /** cpuMs: the command's CPU time (user + system, 10 ms ticks): wall time moves with the machine's load. */
  status: StatusRuns & { exitCode: number | null; pods: number; alt?: StatusRuns & { bin: string } };
}
/** ms, cpuMs: the median run's; runsMs, runsCpuMs: every run, in order. */
interface StatusRuns { ms: number; cpuMs: number; runsMs: number[]; runsCpuMs: number[] }
interface SizeResult extends Sample {
  /** One self-check period watched after the sample and `meshcap status` (--watch-self-check). */
  selfCheckWatch?: SelfCheckWatch;
  coldStart?: { wallMs: number; startupMs: number; reconcileMs: number; cpuMs: number; steps: Record<string, number>; attachments: number; restored: number; dropped: number; rssMiB: number; mem: Mem; loadavg: number[]; settled?: Settled };
  registerPerSec: number;
}
const results: SizeResult[] = [];
const log = (s: string) => process.stderr.write(`bench:scale: ${s}\n`);

/**
 * One row: WARMUP unrecorded ADD+DEL pairs, SAMPLE sequential ADDs of fresh
 * pods on top of `size` (timed), their DELs, the agent's RSS and `meshcap
 * status` over every pod.
 */
async function sampleAt(size: number, tag: string, label = ''): Promise<Sample> {
  // Warm-up, unrecorded: right after a (re)start the agent's ADD path is
  // still being compiled by V8, and a row sampled then measured the JIT,
  // not the pod count (10-pod rows read agent p50 0.5-2.8 ms, the 10,000-pod
  // row, sampled after adopting 10,000 pods had run the same code, 0.5-1.0).
  for (let i = 0; i < WARMUP; i++) {
    await runCni('ADD', `w${i}`, `q${i % SAMPLE}`, probePath(i % SAMPLE), probeIp(i % SAMPLE));
    await runCni('DEL', `w${i}`, `q${i % SAMPLE}`, probePath(i % SAMPLE), probeIp(i % SAMPLE));
  }
  // the sample: SAMPLE sequential ADDs of fresh pods on top of `size`, then their DELs
  await new Promise((r) => setTimeout(r, 500));
  const loadavg = os.loadavg();
  const addMs: number[] = [];
  const addAgentMs: number[] = [];
  // the agent's CPU over the ADDs: its own work, apart from what it waits for
  const agentCpu0 = cpuMsOf(agent!.pid!);
  for (let i = 0; i < SAMPLE; i++) {
    const r = await runCni('ADD', `${tag}${i}`, `q${i}`, probePath(i), probeIp(i));
    if (r.code !== 0) throw new Error(`ADD q${i} failed: ${r.out}`);
    addMs.push(r.ms);
  }
  const addAgentCpuUs = ((cpuMsOf(agent!.pid!) - agentCpu0) * 1000) / SAMPLE;
  const mem = memOf(agent!.pid!);
  const rss = mem.rss;
  const delMs: number[] = [];
  for (let i = 0; i < SAMPLE; i++) {
    const r = await runCni('DEL', `${tag}${i}`, `q${i}`, probePath(i), probeIp(i));
    if (r.code !== 0) throw new Error(`DEL q${i} failed: ${r.out}`);
    delMs.push(r.ms);
  }
  await new Promise((r) => setTimeout(r, 200)); // the last log lines
  for (let i = 0; i < SAMPLE; i++) {
    const v = agentMs.get(`ADD:${tag}${i}`);
    if (v === undefined) throw new Error(`no agent log line for ADD ${tag}${i}`);
    addAgentMs.push(v);
  }

  // BENCH_SCALE_STATUS_NODE_ARGS='--cpu-prof --cpu-prof-dir=/tmp/p': node flags for `meshcap status` (a profile of it)
  const statusNodeArgs = (process.env.BENCH_SCALE_STATUS_NODE_ARGS ?? '').split(' ').filter(Boolean);
  const statusOnce = (bin: string) => {
    const c0 = childCpuMs();
    const s0 = performance.now();
    const st = spawnSync(process.execPath, [...statusNodeArgs, bin, 'status', '-o', 'json', '--state-dir', stateDir, '--pin-root', pinRoot, '--socket', socket], { maxBuffer: 1 << 30, encoding: 'utf8' });
    const ms = performance.now() - s0;
    let pods = -1;
    try {
      pods = (JSON.parse(st.stdout) as { pods: unknown[] }).pods.length;
    } catch { /* reported as -1 */ }
    return { ms, cpuMs: childCpuMs() - c0, exitCode: st.status, pods };
  };
  const runs: ReturnType<typeof statusOnce>[] = [];
  const altRuns: ReturnType<typeof statusOnce>[] = [];
  for (let i = 0; i < STATUS_RUNS; i++) {
    // alternated, the alternative first every other time (neither always runs on a warmer cache)
    const order = STATUS_ALT && i % 2 === 1 ? [STATUS_ALT, MESHCAP] : [MESHCAP, ...(STATUS_ALT ? [STATUS_ALT] : [])];
    for (const bin of order) (bin === MESHCAP ? runs : altRuns).push(statusOnce(bin));
  }
  const medianRun = (rs: typeof runs): StatusRuns => {
    const mid = [...rs].sort((a, b) => a.ms - b.ms)[(rs.length - 1) >> 1]!;
    return { ms: mid.ms, cpuMs: mid.cpuMs, runsMs: rs.map((r) => Math.round(r.ms)), runsCpuMs: rs.map((r) => r.cpuMs) };
  };
  const bad = [...runs, ...altRuns].find((r) => r.exitCode !== runs[0]!.exitCode || r.pods !== runs[0]!.pods);
  if (bad) throw new Error(`meshcap status runs disagree at ${size} pods: exit ${runs[0]!.exitCode} / ${bad.exitCode}, ${runs[0]!.pods} / ${bad.pods} pods`);
  const status: Sample['status'] = { ...medianRun(runs), exitCode: runs[0]!.exitCode, pods: runs[0]!.pods, ...(STATUS_ALT ? { alt: { bin: STATUS_ALT, ...medianRun(altRuns) } } : {}) };
  const res: Sample = { pods: size, loadavg, addExecToExit: summary(addMs), addSamplesMs: addMs.map((ms) => Math.round(ms * 1000) / 1000), addAgent: summary(addAgentMs), addAgentCpuUs, delExecToExit: summary(delMs), agentRssMiB: rss, agentMem: mem, status };
  log(`${size} pods${label}: ADD p50 ${res.addExecToExit.p50.toFixed(2)} ms (agent ${res.addAgent.p50.toFixed(2)} ms, its CPU ${addAgentCpuUs.toFixed(0)} µs per ADD), RSS ${memText(mem)}, status ${status.ms.toFixed(0)} ms, CPU ${status.cpuMs} ms (median of ${STATUS_RUNS}: ${status.runsMs.join(' / ')}; ${status.pods} pods, exit ${status.exitCode})${status.alt ? `; --status-alt ${status.alt.ms.toFixed(0)} ms, CPU ${status.alt.cpuMs} ms (${status.alt.runsMs.join(' / ')})` : ''}`);
  return res;
}

try {
  log(`making ${maxPods + SAMPLE} network namespaces (private mount namespace)`);
  const batch = [...Array.from({ length: maxPods }, (_, i) => `netns add p${i}`), ...Array.from({ length: SAMPLE }, (_, i) => `netns add q${i}`)].join('\n') + '\n';
  execFileSync('ip', ['-batch', '-'], { input: batch, stdio: ['pipe', 'ignore', 'inherit'] });
  if (API) await startControlPlane();
  await setPods(SIZES[0]!);

  trace?.phase('start');
  let a = await startAgentProcess();
  await new Promise((r) => setTimeout(r, 1000));
  const readyMem = memOf(agent!.pid!);
  const readyRssMiB = readyMem.rss;
  log(`agent ready in ${a.wallMs.toFixed(0)} ms, RSS ${memText(readyMem)} with no pod registered`);
  // warm-up: JIT and lazy module loads; then the probe pods go again
  for (let i = 0; i < 5; i++) {
    await runCni('ADD', `w${i}`, `q${i}`, probePath(i), probeIp(i));
    await runCni('DEL', `w${i}`, `q${i}`, probePath(i), probeIp(i));
  }
  let registered = 0;
  for (const size of SIZES) {
    if (size !== SIZES[0]) await setPods(size);
    trace?.phase(`register to ${size}`);
    const t0 = performance.now();
    const from = registered;
    await pool(size - from, CONC, async (k) => {
      const i = from + k;
      const r = await runCni('ADD', `c${i}`, `p${i}`, nsPath(i), ipOf(i));
      if (r.code !== 0) throw new Error(`ADD p${i} failed: ${r.out}`);
    });
    registered = size;
    const registerPerSec = ((size - from) * 1000) / (performance.now() - t0);
    log(`${size} pods registered (${registerPerSec.toFixed(0)} ADD/s at ${CONC} at once)`);
    if (listeners) {
      // after the ADDs: sockops registers a listener only in a pod the maps already hold
      const held = await listeners.add(Array.from({ length: size - from }, (_, k) => nsPath(from + k)));
      const keys = listenKeys();
      log(`${held} sockets listening in the pods (${listeners.socketsPerPod} each); mc_listen holds ${keys}`);
      if (keys < held) log(`WARNING: ${held - keys} listening sockets are not in mc_listen (it holds ${keys}): is it full?`);
    }

    let coldStart: SizeResult['coldStart'];
    if (RESTART_AT.has(size)) {
      trace?.phase(`restart at ${size}`);
      await stopAgent();
      await new Promise((r) => setTimeout(r, 1000));
      const loadavg = os.loadavg();
      a = await startAgentProcess();
      const r = a.ready;
      coldStart = { wallMs: a.wallMs, startupMs: r.startupMs as number, reconcileMs: r.reconcileMs as number, cpuMs: r.cpuMs as number, steps: r.steps as Record<string, number>, attachments: r.attachments as number, restored: r.restored as number, dropped: r.dropped as number, ...(() => { const mem = memOf(agent!.pid!); return { rssMiB: mem.rss, mem }; })(), loadavg };
      log(`cold start with ${size} pods: ${a.wallMs.toFixed(0)} ms to ready (agent's startupMs ${String(r.startupMs)}, CPU ${String(r.cpuMs)} ms, steps ${JSON.stringify(r.steps)}; restored ${String(r.restored)}, dropped ${String(r.dropped)})`);
      for (let i = 0; i < 5; i++) {
        await runCni('ADD', `w${i}`, `q${i}`, probePath(i), probeIp(i));
        await runCni('DEL', `w${i}`, `q${i}`, probePath(i), probeIp(i));
      }
    }

    trace?.phase(`sample at ${size}`);
    const res: SizeResult = { ...(await sampleAt(size, `s${size}-`)), registerPerSec, ...(coldStart ? { coldStart: { ...coldStart, ...(lastSettled ? { settled: lastSettled } : {}) } } : {}) };
    results.push(res);
    if (WATCH_AT.has(size)) {
      trace?.phase(`self-check watch at ${size}`);
      res.selfCheckWatch = await watchSelfCheck(agent!.pid!);
      const w = res.selfCheckWatch;
      log(`${size} pods, one self-check period watched (${w.samples} samples): RSS at rest ${w.restMiB.toFixed(1)} MiB, peak ${w.peakMiB.toFixed(1)} MiB (anon ${w.peakAnonMiB.toFixed(1)}), agent CPU ${w.cpuMs} ms, VmHWM ${w.hwmMiB.toFixed(1)} MiB`);
    }
  }
  // Back down to the first size (DELs as a kubelet would send them, then the
  // node's pod list), and that row again: same agent, same namespaces on the
  // machine, only the registered pods differ.
  let drained: Sample | undefined;
  if (DRAIN) {
    const to = SIZES[0]!;
    trace?.phase(`drain to ${to}`);
    const t0 = performance.now();
    const from = registered;
    await pool(from - to, CONC, async (k) => {
      const i = from - 1 - k;
      const r = await runCni('DEL', `c${i}`, `p${i}`, nsPath(i), ipOf(i));
      if (r.code !== 0) throw new Error(`DEL p${i} failed: ${r.out}`);
    });
    log(`drained to ${to} pods (${(((from - to) * 1000) / (performance.now() - t0)).toFixed(0)} DEL/s at ${CONC} at once)`);
    registered = to;
    await setPods(to);
    trace?.phase(`sample at ${to}, drained`);
    drained = await sampleAt(to, 'd-', ', drained back from ' + String(SIZES.at(-1)));
    if (drained.status.pods !== to) throw new Error(`after the drain meshcap status shows ${drained.status.pods} pods, not ${to}: the DELs left pods behind`);
  }
  trace?.phase('stop');
  const peakTrace = await trace?.stop();
  await stopAgent();

  const f = (x: number) => x.toFixed(2).padStart(7);
  console.log(`eBPF mode, meshed Istio pods ${API ? `from a real kube-apiserver (--source api: Istio-injected pods as the API server stores them, ${(apiPodBytes / 1024).toFixed(1)} KiB of JSON each)` : 'from a pods file (--standalone)'}${listeners ? ` with ${listeners.socketsPerPod} listening sockets each (--listen${LISTEN_WORKERS > 1 ? ` --listen-workers ${LISTEN_WORKERS}` : ''}; mc_listen holds ${listenKeys()} at the end)` : ''}, ${SAMPLE} ADDs sampled per size after ${WARMUP} unrecorded ADD+DEL pairs, plugin exec'd by ${opt.exec === 'node' ? "the bench's Node process (fork + exec)" : 'mc-cni-exec (posix_spawn, as a runtime)'}, ${os.cpus().length} CPUs, kernel ${os.release()}, node ${process.version}`);
  console.log(`agent env (deploy/meshcap.yaml${opt['agent-node-options'] !== undefined ? ', NODE_OPTIONS from --agent-node-options' : ''}): ${JSON.stringify(agentEnv)}${Object.keys(agentSwitches).length > 0 ? `, switches ${JSON.stringify(agentSwitches)}` : ''}; RSS at ready with no pod registered: ${memText(readyMem)}`);
  console.log('pods registered   ADD p50   ADD p99   agent p50  agent p99  agent CPU/ADD µs   DEL p50   RSS MiB (MB, anon/file MiB)   status ms   load avg');
  for (const r of results) {
    console.log(`${String(r.pods).padStart(15)}  ${f(r.addExecToExit.p50)}   ${f(r.addExecToExit.p99)}   ${f(r.addAgent.p50)}  ${f(r.addAgent.p99)}  ${r.addAgentCpuUs.toFixed(0).padStart(16)}   ${f(r.delExecToExit.p50)}   ${`${r.agentMem.rss.toFixed(1)} (${(r.agentMem.rss * 1.048576).toFixed(1)}, ${r.agentMem.anon.toFixed(1)}/${r.agentMem.file.toFixed(1)})`.padEnd(27)}   ${r.status.ms.toFixed(0).padStart(9)} (CPU ${r.status.cpuMs})   ${r.loadavg.map((x) => x.toFixed(1)).join(' ')}`);
  }
  for (const r of results) {
    const w = r.selfCheckWatch;
    if (w) console.log(`${r.pods} pods, one self-check period (${(w.ms / 1000).toFixed(1)} s, RSS every 20 ms): RSS at rest ${w.restMiB.toFixed(1)} MiB (${(w.restMiB * 1.048576).toFixed(1)} MB), peak ${w.peakMiB.toFixed(1)} MiB (${(w.peakMiB * 1.048576).toFixed(1)} MB; anon ${w.peakAnonMiB.toFixed(1)}), agent CPU in the period ${w.cpuMs} ms (load ${w.loadavg.map((x) => x.toFixed(1)).join(' ')})`);
  }
  for (const r of results) {
    if (r.coldStart) console.log(`cold start adopting ${r.pods} pods: ${r.coldStart.wallMs.toFixed(0)} ms spawn to ready (agent startupMs ${r.coldStart.startupMs}, of which reconcile ${r.coldStart.reconcileMs}; CPU to ready ${r.coldStart.cpuMs} ms; ${r.coldStart.restored} restored, ${r.coldStart.dropped} dropped; RSS ${memText(r.coldStart.mem)}; load ${r.coldStart.loadavg.map((x) => x.toFixed(1)).join(' ')})${r.coldStart.settled ? `; settled ${r.coldStart.settled.sinceReadyMs} ms after ready (full GCs ${r.coldStart.settled.gcMs.join(' + ')} ms), then RSS ${r.coldStart.settled.rssMiB} MiB, VmHWM ${r.coldStart.settled.peakMiB.toFixed(1)} MiB` : ''}`);
  }
  const first = results[0]!;
  const last = results.at(-1)!;
  const growth = (a: number, b: number) => `${(((b / a) - 1) * 100).toFixed(1)}%`;
  console.log(`ADD p50 growth ${first.pods} -> ${last.pods} pods: ${growth(first.addExecToExit.p50, last.addExecToExit.p50)} (exec to exit), ${growth(first.addAgent.p50, last.addAgent.p50)} (agent)`);
  if (drained) {
    const d = drained;
    console.log(`${d.pods} pods again after draining: ADD p50 ${f(d.addExecToExit.p50)} ms, p99 ${f(d.addExecToExit.p99)} ms, agent p50 ${f(d.addAgent.p50)} ms, agent CPU/ADD ${d.addAgentCpuUs.toFixed(0)} µs, DEL p50 ${f(d.delExecToExit.p50)} ms, RSS ${memText(d.agentMem)}, status ${d.status.ms.toFixed(0)} ms (load ${d.loadavg.map((x) => x.toFixed(1)).join(' ')})`);
    const both = (pick: (r: Sample) => number) => (pick(first) + pick(d)) / 2;
    console.log(`ADD p50 growth ${last.pods} pods against ${first.pods} at both ends of the run (before and after): ${growth(d.addExecToExit.p50, last.addExecToExit.p50)} against after, ${growth(both((r) => r.addExecToExit.p50), last.addExecToExit.p50)} against their mean (exec to exit); agent ${growth(both((r) => r.addAgent.p50), last.addAgent.p50)}, agent CPU/ADD ${growth(both((r) => r.addAgentCpuUs), last.addAgentCpuUs)} against the mean`);
  }
  if (peakTrace) console.log(peakTraceText(peakTrace));
  const data = { when: new Date().toISOString(), exec: opt.exec, source: opt.source, ...(API ? { apiPodBytes } : {}), agentEnv, agentSwitches, readyRssMiB, readyMem, cpus: os.cpus().length, kernel: os.release(), node: process.version, sample: SAMPLE, warmup: WARMUP, listen: opt.listen, listenWorkers: LISTEN_WORKERS, listenEntries: opt['listen-entries'] ?? null, driftPasses, results, ...(drained ? { drained } : {}), ...(peakTrace ? { peakTrace } : {}) };
  if (opt.json) writeFileSync(opt.json, JSON.stringify(data, null, 1) + '\n');
  if (opt.plot) {
    plotScale(data, opt.plot);
    log(`plot: ${opt.plot}`);
  }
} finally {
  cleanup();
}
