// npm run bench:cni — CNI ADD latency as a container runtime sees it: from
// exec of build/bin/meshcap-cni to its exit (exec'd by a small native parent,
// bench/cni/mc-cni-exec.c, as containerd's Go does it; the Node parent's
// figure is a row of its own), against a real `meshcap agent`
// (its own process, standalone, pods file), for a meshed Istio pod whose
// netns this bench made, in eBPF mode and in iptables mode, sequential and
// 16-way concurrent. Also an unmeshed pod (forwarder + agent round trip, no
// datapath write) as the floor. Beside them, the same pods through the real
// istio-cni plugin (build/istio/istio-cni, `npm run build:peers`), chained
// the same way, reading each pod from a real kube-apiserver
// (test/helpers/k8s-control-plane.ts, build/k8s/bin) and applying its rules in
// the pod's netns (docs/bench-cni.md says what each column measures). DEL is
// timed too. Needs root, `npm run build` (dist/, the addon, the BPF objects)
// and build/bin/meshcap-cni.
//
//   node --import ./bench/lib/ts.mjs bench/cni/main.ts [--pods 200] [--concurrency 16] [--modes ebpf,iptables,istio-cni] [--json FILE] [--plot FILE.svg]
//   ... bench/cni/main.ts --plot-only FILE.json --plot FILE.svg   (redraw from a stored run)
//
// Everything it makes (netns, pins, state, socket, the control plane) is in
// one lab (src/lab) and removed at the end, also on failure and Ctrl-C. Each
// pod netns has a veth pair (both ends inside it) with the pod's address
// (istio-cni reads it to decide IPv6): no traffic leaves any namespace.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseOptions } from '../../scripts/lib/cli-options.mjs';
import { createStepProgress } from '../../scripts/lib/progress.mjs';
import { addVeth, cleanupOnSignals, Lab } from '../../src/lab/index.js';
import { projectRoot } from '../../src/paths.js';
import { Launcher, runNode, type ExecResult } from './launcher.js';
import { plotCni } from './plot.js';

const CNI = path.join(projectRoot, 'build/bin/meshcap-cni');
const MESHCAP = path.join(projectRoot, 'bin/meshcap');
const ISTIO_CNI = path.join(projectRoot, 'build/istio/istio-cni');

const opt = parseOptions(import.meta.url, 'bench:cni', {
  pods: { type: 'string', default: '200' },
  concurrency: { type: 'string', default: '16' },
  modes: { type: 'string', default: 'ebpf,iptables,istio-cni' },
  json: { type: 'string' },
  plot: { type: 'string' },
  'plot-only': { type: 'string' },
});
if (opt['plot-only']) {
  if (!opt.plot) throw new Error('--plot-only FILE.json needs --plot FILE.svg');
  plotCni(JSON.parse(readFileSync(opt['plot-only'], 'utf8')), opt.plot);
  process.exit(0);
}
type Mode = 'ebpf' | 'iptables' | 'istio-cni';
const N = Number(opt.pods);
const CONC = Number(opt.concurrency);
const MODES = opt.modes.split(',') as Mode[];
if (!(N >= 1 && CONC >= 1)) throw new Error('--pods and --concurrency must be positive');
if (process.getuid?.() !== 0) throw new Error('run as root: the bench makes network namespaces and loads BPF programs');
for (const m of MODES) if (!['ebpf', 'iptables', 'istio-cni'].includes(m)) throw new Error(`--modes: unknown mode ${m} (ebpf, iptables, istio-cni)`);
for (const f of [CNI, path.join(projectRoot, 'dist/cli/main.js')]) if (!existsSync(f)) throw new Error(`${f} is missing: npm run build`);
if (opt.plot) {
  try {
    execFileSync('sh', ['-c', 'command -v gnuplot'], { stdio: 'ignore' });
  } catch {
    throw new Error('--plot needs gnuplot: run npm run setup (package gnuplot-nox)');
  }
}
if (MODES.includes('istio-cni') && !existsSync(ISTIO_CNI)) throw new Error(`${ISTIO_CNI} is missing: npm run build:peers (or leave istio-cni out of --modes)`);

/** Whether dir is a tmpfs mount point (/proc/self/mountinfo: field 5 the mount point, the type after ' - '). */
function isTmpfs(dir: string): boolean {
  return readFileSync('/proc/self/mountinfo', 'utf8').split('\n').some((l) => l.split(' ')[4] === dir && l.split(' - ')[1]?.startsWith('tmpfs '));
}

const lab = new Lab('mcbench', String(process.pid));
const stopOnSignals = cleanupOnSignals(() => lab.close(), (msg) => process.stderr.write(`bench:cni: ${msg}\n`));
// Socket, state records, pods file and the agent's log on tmpfs, where the
// agent has them in production (/var/run/meshcap): a new file on this disk's
// ext4 costs ~0.17 ms to create, on tmpfs ~0.02 ms, and every meshed ADD
// writes a state record. Where /run is no tmpfs (this machine: the root
// ext4), /dev/shm, which is one on every Linux with glibc's shm_open.
const tmpBase = ['/run', '/dev/shm'].find(isTmpfs) ?? os.tmpdir();
const tmp = mkdtempSync(path.join(tmpBase, 'meshcap-bench-'));
lab.add(`temp dir ${tmp}`, () => rmSync(tmp, { recursive: true, force: true }));
// Undone in reverse: the agent stops before its pins are uninstalled. With
// --force: a run that failed mid-row leaves its pods captured, and a plain
// uninstall refuses then, which left the run's programs attached at the
// cgroup root (a failed ADD on 2026-11-30 did). The pods are the bench's own
// netns, removed with it.
let pinRoot: string | undefined;
lab.add('pins', () => {
  if (pinRoot) execFileSync(process.execPath, [MESHCAP, 'uninstall', '--force', '--pin-root', pinRoot], { stdio: 'ignore' });
});
let controlPlane: { stop(): Promise<void> } | undefined;
lab.add('control plane', () => controlPlane?.stop());
let agent: ChildProcess | undefined;
let agentErr = '';
lab.add('agent', async () => {
  const a = agent;
  if (!a || a.exitCode !== null) return;
  a.kill('SIGKILL');
  await new Promise((res) => a.once('exit', res));
});

interface Row {
  mode: Mode;
  op?: 'DEL' | 'VERSION';
  pod: 'unmeshed' | 'meshed-out' | 'meshed' | 'none';
  /** who exec'd the plugin: the native launcher (default, as a runtime) or the bench's Node process */
  parent?: 'node';
  concurrency: number;
  n: number;
  p50: number;
  p90: number;
  p99: number;
  max: number;
  perSec: number;
  /** every exec-to-exit time of the row, ms (the plot's distribution) */
  samples: number[];
  /** the plugin process's own CPU time per op, p50, ms (wait4's rusage; native parent only) */
  pluginCpuMs?: number;
  /** the meshcap agent's CPU time per op over the row (all its threads, /proc/PID/task/* /schedstat), ms */
  agentCpuMs?: number;
  /** the same for the agent's main (JS) thread alone: its request handling, without the libuv pool's program loads */
  agentMainCpuMs?: number;
  /** p50 of the agent's own durationMs per request (its log line: connection accepted to reply written), ms */
  agentP50?: number | undefined;
}

const podYaml = (name: string, meshed: boolean, noInbound = false) => `apiVersion: v1
kind: Pod
metadata:
  name: ${name}
  namespace: bench
${meshed ? "  annotations:\n    sidecar.istio.io/status: '{\"containers\":[\"istio-proxy\"]}'\n" : ''}${noInbound ? "    traffic.sidecar.istio.io/includeInboundPorts: ''\n" : ''}spec:
  containers:
  - {name: app, image: app}
${meshed ? '  - {name: istio-proxy, image: proxyv2}\n' : ''}`;

const launcher = new Launcher();
lab.add('launcher', () => launcher.close());
/** One plugin run, exec'd by the native launcher, timed from exec to exit. */
async function runCni(env: NodeJS.ProcessEnv, stdin: string, bin = CNI): Promise<ExecResult> {
  const r = await launcher.run(bin, env, stdin);
  if (r.cpuMs !== undefined) cpuSamples.push(r.cpuMs);
  return r;
}
/** the plugin CPU times of the row being timed */
let cpuSamples: number[] = [];

function cniEnv(command: string, i: string, pod: string, ns: string): NodeJS.ProcessEnv {
  return {
    CNI_COMMAND: command,
    CNI_CONTAINERID: `bench${i}-${pod}`,
    CNI_NETNS: ns,
    CNI_IFNAME: 'eth0',
    CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=${pod}`,
    CNI_PATH: '/opt/cni/bin',
  };
}

const podIP = (i: number) => `198.18.${100 + (i >> 8)}.${i & 255}`;
const prevResult = (ns: string, i: number) => ({ cniVersion: '1.0.0', interfaces: [{ name: 'eth0', sandbox: ns }], ips: [{ address: `${podIP(i)}/16`, interface: 0 }] });

function conf(socket: string, ns: string, i: number): string {
  return JSON.stringify({
    cniVersion: '1.0.0', name: 'bench', type: 'meshcap-cni', agentSocket: socket, agentTimeoutMs: 30000,
    prevResult: prevResult(ns, i),
  });
}

async function pool<T, R>(items: T[], width: number, fn: (item: T, i: number) => Promise<R>): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(width, items.length) }, async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]!, i);
    }
  }));
  return out;
}

/** CPU time of the process's main thread (the agent's one JS thread), ms. */
function mainThreadCpuMs(pid: number): number {
  try {
    return Number(readFileSync(`/proc/${pid}/task/${pid}/schedstat`, 'utf8').split(' ')[0]) / 1e6;
  } catch {
    return NaN;
  }
}

/** CPU time a process has used so far, all threads, ms (schedstat: ns, exact, unlike the 10 ms ticks of /proc/PID/stat). */
function processCpuMs(pid: number): number {
  let ns = 0;
  for (const t of readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(readFileSync(`/proc/${pid}/task/${t}/schedstat`, 'utf8').split(' ')[0]);
    } catch { /* a thread that just ended */ }
  }
  return ns / 1e6;
}

const pct = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
function summary(ms: number[], wallMs: number) {
  const s = [...ms].sort((a, b) => a - b);
  return { n: s.length, p50: pct(s, 50), p90: pct(s, 90), p99: pct(s, 99), max: s.at(-1)!, perSec: (s.length * 1000) / wallMs, samples: ms.map((x) => Math.round(x * 1000) / 1000) };
}
/** The agent's log (its stdout): a file, so each row can read the agent's own durationMs of its requests. */
let agentLog: string | undefined;
function agentLogFd(dir: string): number {
  agentLog = path.join(dir, 'agent.log');
  return openSync(agentLog, 'w');
}
/** p50 of the agent's own durationMs (accept to reply) over the 'cni request' lines logged since `from` (bytes). */
function agentDurationP50(from: number): number | undefined {
  if (!agentLog) return undefined;
  const text = readFileSync(agentLog, 'utf8').slice(from);
  const d: number[] = [];
  for (const line of text.split('\n')) {
    if (!line.includes('"cni request"')) continue;
    try {
      const o = JSON.parse(line) as { durationMs?: unknown };
      if (typeof o.durationMs === 'number') d.push(o.durationMs);
    } catch { /* a line cut at the end */ }
  }
  return d.length ? pct(d.sort((a, b) => a - b), 50) : undefined;
}
const logSize = () => (agentLog && existsSync(agentLog) ? statSync(agentLog).size : 0);

/** Runs fn, returns its latencies' summary with the row's throughput (and the agent's CPU per op and own time, when one runs). */
async function timed(fn: () => Promise<number[]>) {
  const pid = agent?.exitCode === null ? agent.pid : undefined;
  const cpu0 = pid !== undefined ? processCpuMs(pid) : 0;
  const main0 = pid !== undefined ? mainThreadCpuMs(pid) : 0;
  const log0 = pid !== undefined ? logSize() : 0;
  cpuSamples = [];
  const t0 = performance.now();
  const ms = await fn();
  const row = summary(ms, performance.now() - t0);
  const cpu = [...cpuSamples].sort((a, b) => a - b);
  return {
    ...row,
    ...(cpu.length === ms.length ? { pluginCpuMs: pct(cpu, 50) } : {}),
    ...(pid !== undefined ? { agentCpuMs: (processCpuMs(pid) - cpu0) / ms.length, agentMainCpuMs: (mainThreadCpuMs(pid) - main0) / ms.length } : {}),
    ...(pid !== undefined ? { agentP50: agentDurationP50(log0) } : {}),
  };
}

async function waitReady(socket: string): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (agent?.exitCode !== null) throw new Error(`agent exited (${agent?.exitCode}): ${agentErr}`);
    const r = await runCni({ CNI_COMMAND: 'STATUS', CNI_PATH: '/opt/cni/bin' }, JSON.stringify({ cniVersion: '1.1.0', name: 'bench', type: 'meshcap-cni', agentSocket: socket }));
    if (r.code === 0) return;
    await new Promise((res) => setTimeout(res, 100));
  }
  throw new Error('agent not ready within 60 s');
}

const results: Row[] = [];
const progress = createStepProgress({ name: 'bench:cni', total: MODES.length * 6 + 1 });

async function benchMode(mode: 'ebpf' | 'iptables', nss: string[]): Promise<void> {
  const dir = path.join(tmp, mode);
  const socket = path.join(dir, 'cni.sock');
  pinRoot = `/sys/fs/bpf/meshcap-bench-${process.pid}-${mode}`;
  const names = Array.from({ length: N }, (_, i) => `pod-${i}`);
  mkdirSync(dir, { recursive: true });
  writeFileSync(path.join(dir, 'pods.yaml'), [...names.map((n) => podYaml(n, true)), ...names.map((n) => podYaml(`${n}-out`, true, true)), podYaml('plain', false)].join('---\n'));
  agentErr = '';
  // BENCH_CNI_AGENT_NODE_ARGS='--cpu-prof --cpu-prof-dir=/tmp/p': node flags for the agent (a profile of its side)
  const nodeArgs = (process.env.BENCH_CNI_AGENT_NODE_ARGS ?? '').split(' ').filter(Boolean);
  const a = spawn(process.execPath, [...nodeArgs, MESHCAP, 'agent', '--standalone', '--pods', path.join(dir, 'pods.yaml'), '--socket', socket,
    '--pin-root', pinRoot, '--mode', mode, '--state-dir', path.join(dir, 'state'), '--exclude-namespaces', 'kube-system'],
  { stdio: ['ignore', agentLogFd(dir), 'pipe'] }); // the agent's per-request log lines are written (to a file: each row reads its durationMs), as in production
  agent = a;
  a.stderr!.on('data', (d: Buffer) => {
    agentErr += d.toString();
  });
  await waitReady(socket);

  const ns = (i: number) => nss[i]!;
  const add = (width: number, tag: string, run = runCni) => pool(names, width, async (pod, i) => {
    const r = await run(cniEnv('ADD', `${tag}${i}`, pod, ns(i)), conf(socket, ns(i), i));
    if (r.code !== 0) throw new Error(`ADD ${pod} (${mode}) failed: ${r.out}`);
    return r.ms;
  });
  const addOutOnly = () => pool(names, 1, async (pod, i) => {
    const r = await runCni(cniEnv('ADD', `o${i}`, `${pod}-out`, ns(i)), conf(socket, ns(i), i));
    if (r.code !== 0) throw new Error(`ADD ${pod}-out (${mode}) failed: ${r.out}`);
    return r.ms;
  });
  const del = (tag: string, suffix = '', width = 16) => pool(names, width, async (pod, i) => {
    pod += suffix;
    const r = await runCni(cniEnv('DEL', `${tag}${i}`, pod, ns(i)), conf(socket, ns(i), i));
    if (r.code !== 0) throw new Error(`DEL ${pod} (${mode}) failed: ${r.out}`);
    return r.ms;
  });

  // warm-up: first requests pay for JIT and lazy module loads in the agent
  for (let i = 0; i < 5; i++) await runCni(cniEnv('ADD', `w${i}`, 'plain', ns(0)), conf(socket, ns(0), 0));

  const plain = async (run: (env: NodeJS.ProcessEnv, stdin: string) => Promise<ExecResult> = runCni) => {
    const ms: number[] = [];
    for (let i = 0; i < N; i++) {
      const r = await run(cniEnv('ADD', `p${i}`, 'plain', ns(i)), conf(socket, ns(i), i));
      if (r.code !== 0) throw new Error(`ADD plain failed: ${r.out}`);
      ms.push(r.ms);
    }
    return ms;
  };
  progress.step(`${mode}: ${N} ADDs, unmeshed, sequential`);
  results.push({ mode, pod: 'unmeshed', concurrency: 1, ...(await timed(plain)) });
  // no inbound capture: no per-pod sk_lookup program to load (eBPF), no inbound rules (iptables)
  progress.step(`${mode}: ${N} ADDs, meshed outbound-only, sequential`);
  results.push({ mode, pod: 'meshed-out', concurrency: 1, ...(await timed(addOutOnly)) });
  await del('o', '-out');
  progress.step(`${mode}: ${N} ADDs, meshed, sequential`);
  results.push({ mode, pod: 'meshed', concurrency: 1, ...(await timed(() => add(1, 's'))) });
  progress.step(`${mode}: ${N} DELs, meshed, sequential`);
  results.push({ mode, op: 'DEL', pod: 'meshed', concurrency: 1, ...(await timed(() => del('s', '', 1))) });
  progress.step(`${mode}: ${N} ADDs, meshed, ${CONC} at once`);
  results.push({ mode, pod: 'meshed', concurrency: CONC, ...(await timed(() => add(CONC, 'c'))) });
  await del('c');
  // the same two sequential rows exec'd from this Node process (the figure of earlier runs)
  const fromNode = (env: NodeJS.ProcessEnv, stdin: string) => runNode(CNI, env, stdin);
  progress.step(`${mode}: ${N} ADDs, unmeshed and meshed, exec'd by Node`);
  results.push({ mode, pod: 'unmeshed', parent: 'node', concurrency: 1, ...(await timed(() => plain(fromNode))) });
  results.push({ mode, pod: 'meshed', parent: 'node', concurrency: 1, ...(await timed(() => add(1, 'n', fromNode))) });
  await del('n');

  a.kill('SIGTERM');
  await new Promise((res) => (a.exitCode !== null ? res(undefined) : a.once('exit', res)));
  execFileSync(process.execPath, [MESHCAP, 'uninstall', '--pin-root', pinRoot], { stdio: 'ignore' });
  pinRoot = undefined;
}

let controlPlaneMs: number | undefined;

/**
 * The real istio-cni plugin on the same pods: a chained plugin after the
 * main one (the same prevResult), sidecar mode (ambient off), reading each
 * pod from a real kube-apiserver through the kubeconfig in its run dir, as
 * the istio-cni DaemonSet sets it up. Istio's DEL does nothing in sidecar
 * mode, and its rules stay in the netns (a real pod's netns goes with the
 * pod): they are flushed between rows, outside the timings.
 */
async function benchIstioCni(nss: string[], nsNames: string[]): Promise<void> {
  const { ControlPlane } = await import('../../test/helpers/k8s-control-plane.js');
  const { CoreV1Api } = await import('@kubernetes/client-node');
  const t0 = performance.now();
  const cp = await ControlPlane.start();
  controlPlane = cp;
  controlPlaneMs = performance.now() - t0;
  const runDir = path.join(tmp, 'istio-cni');
  mkdirSync(runDir, { recursive: true });
  cp.writeAdminKubeconfig(path.join(runDir, 'istio-cni-kubeconfig'));
  const core = cp.adminKubeConfig().makeApiClient(CoreV1Api);
  await cp.createNamespace('bench');
  const pod = (name: string, meshed: boolean, noInbound = false) => ({
    metadata: {
      name, namespace: 'bench',
      annotations: {
        ...(meshed ? { 'sidecar.istio.io/status': '{"containers":["istio-proxy"]}' } : {}),
        ...(noInbound ? { 'traffic.sidecar.istio.io/includeInboundPorts': '' } : {}),
      },
    },
    spec: { containers: [{ name: 'app', image: 'app' }, ...(meshed ? [{ name: 'istio-proxy', image: 'proxyv2' }] : [])] },
  });
  const names = Array.from({ length: N }, (_, i) => `pod-${i}`);
  await pool([...names.map((n) => pod(n, true)), ...names.map((n) => pod(`${n}-out`, true, true)), pod('plain', false)], 8,
    (body) => core.createNamespacedPod({ namespace: 'bench', body }));

  const istioConf = (i: number) => JSON.stringify({
    cniVersion: '1.0.0', name: 'bench', type: 'istio-cni', plugin_log_level: 'info', cni_agent_run_dir: runDir,
    ambient_enabled: false, exclude_namespaces: ['kube-system'], pod_namespace: 'istio-system', prevResult: prevResult(nss[i]!, i),
  });
  // istio-cni runs iptables-save/-restore: it needs a PATH (a runtime passes its own)
  const env = (command: string, tag: string, name: string, i: number) => ({ ...cniEnv(command, tag, name, nss[i]!), PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin' });
  const run = async (command: string, tag: string, name: string, i: number) => {
    const r = await runCni(env(command, tag, name, i), istioConf(i), ISTIO_CNI);
    if (r.code !== 0) throw new Error(`istio-cni ${command} ${name} failed (exit ${r.code}): ${r.out}`);
    return r.ms;
  };
  const flush = () => pool(nsNames, 8, (ns) => new Promise<void>((resolve, reject) => {
    const p = spawn('ip', lab.argv(ns, ['sh', '-c',
      'for b in iptables-nft ip6tables-nft iptables-legacy ip6tables-legacy; do if $b-save 2>/dev/null | grep -q ISTIO; then printf \'*nat\\nCOMMIT\\n*mangle\\nCOMMIT\\n\' | $b-restore || exit 1; fi; done']), { stdio: 'ignore' });
    p.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`flushing Istio's rules in ${ns} failed`))));
  }));

  // the ADDs must really program (or really skip): Istio's chains in the pod netns, or none
  const last = nsNames.at(-1)!;
  const istioChains = (ns: string) => execFileSync('ip', lab.argv(ns, ['sh', '-c', 'iptables-nft-save 2>/dev/null; iptables-legacy-save 2>/dev/null']), { encoding: 'utf8' })
    .split('\n').filter((l) => l.startsWith('-A ISTIO_')).length;
  const expectChains = (what: string, want: boolean) => {
    const n = istioChains(last);
    if (want ? n === 0 : n > 0) throw new Error(`istio-cni ${what}: ${n} ISTIO_ rules in ${last}, expected ${want ? 'some' : 'none'}`);
  };

  for (let i = 0; i < 5; i++) await run('ADD', `w${i}`, 'plain', 0);
  progress.step(`istio-cni: ${N} ADDs, unmeshed, sequential`);
  results.push({ mode: 'istio-cni', pod: 'unmeshed', concurrency: 1, ...(await timed(() => pool(names, 1, (_, i) => run('ADD', `p${i}`, 'plain', i)))) });
  progress.step(`istio-cni: ${N} ADDs, meshed outbound-only, sequential`);
  expectChains('unmeshed ADD', false);
  results.push({ mode: 'istio-cni', pod: 'meshed-out', concurrency: 1, ...(await timed(() => pool(names, 1, (n, i) => run('ADD', `o${i}`, `${n}-out`, i)))) });
  expectChains('meshed ADD', true);
  await flush();
  progress.step(`istio-cni: ${N} ADDs, meshed, sequential`);
  results.push({ mode: 'istio-cni', pod: 'meshed', concurrency: 1, ...(await timed(() => pool(names, 1, (n, i) => run('ADD', `s${i}`, n, i)))) });
  progress.step(`istio-cni: ${N} DELs, meshed, sequential`);
  results.push({ mode: 'istio-cni', op: 'DEL', pod: 'meshed', concurrency: 1, ...(await timed(() => pool(names, 1, (n, i) => run('DEL', `s${i}`, n, i)))) });
  await flush();
  progress.step(`istio-cni: ${N} ADDs, meshed, ${CONC} at once`);
  results.push({ mode: 'istio-cni', pod: 'meshed', concurrency: CONC, ...(await timed(() => pool(names, CONC, (n, i) => run('ADD', `c${i}`, n, i)))) });
  await flush();
  await cp.stop();
  controlPlane = undefined;
}

const loadBefore = os.loadavg();
const startedAt = new Date().toISOString();
try {
  const nss: string[] = [];
  const nsNames: string[] = [];
  for (let i = 0; i < N; i++) {
    const ns = await lab.netns(String(i), { lo: false });
    // the pod's address on a link of its own (a veth pair with both ends in
    // the pod netns: nothing can leave), as the main plugin leaves it;
    // istio-cni decides IPv6 from it
    await addVeth({ ns: ns.name, ifname: 'eth0', v4: [`${podIP(i)}/16`] }, { ns: ns.name, ifname: 'peer0' });
    nss.push(ns.path);
    nsNames.push(ns.name);
  }
  // the forwarder alone: exec, VERSION answered without the agent, exit (the exec floor)
  progress.step(`meshcap-cni: ${N} VERSION, no agent`);
  results.push({ mode: MODES[0]!, op: 'VERSION', pod: 'none', concurrency: 1, ...(await timed(() => pool(Array.from({ length: N }), 1, async () => {
    const r = await runCni({ CNI_COMMAND: 'VERSION' }, '{"cniVersion":"1.0.0"}');
    if (r.code !== 0) throw new Error(`meshcap-cni VERSION failed: ${r.out}`);
    return r.ms;
  }))) });
  for (const mode of MODES) await (mode === 'istio-cni' ? benchIstioCni(nss, nsNames) : benchMode(mode, nss));
  progress.done();
  const f = (x: number) => x.toFixed(2).padStart(7);
  console.log(`CNI ADD/DEL, exec to exit, ${N} pods per row, ${os.cpus().length} CPUs, kernel ${os.release()}, node ${process.version}`);
  console.log(`${'mode'.padEnd(10)}${'op'.padEnd(8)}${'pod'.padEnd(12)}${'parent'.padEnd(7)}${'conc'.padStart(5)}${'n'.padStart(6)}   p50 ms   p90 ms   p99 ms   max ms  ops/s  plugin CPU ms  agent CPU ms  (JS thread)  agent p50 ms`);
  for (const r of results) {
    console.log(`${r.mode.padEnd(10)}${(r.op ?? 'ADD').padEnd(8)}${r.pod.padEnd(12)}${(r.parent ?? 'native').padEnd(7)}${String(r.concurrency).padStart(5)}${String(r.n).padStart(6)}  ${f(r.p50)}  ${f(r.p90)}  ${f(r.p99)}  ${f(r.max)}  ${r.perSec.toFixed(0).padStart(5)}  ${(r.pluginCpuMs?.toFixed(3) ?? '-').padStart(13)}  ${(r.agentCpuMs?.toFixed(3) ?? '-').padStart(12)}  ${(r.agentMainCpuMs?.toFixed(3) ?? '-').padStart(11)}  ${(r.agentP50?.toFixed(2) ?? '-').padStart(12)}`);
  }
  if (controlPlaneMs !== undefined) console.log(`istio-cni read its pods from a real kube-apiserver (etcd + kube-apiserver started in ${(controlPlaneMs / 1000).toFixed(1)} s, not in any row)`);
  const e = results.find((r) => r.mode === 'ebpf' && !r.op && !r.parent && r.pod === 'meshed' && r.concurrency === 1);
  const e16 = results.find((r) => r.mode === 'ebpf' && !r.op && !r.parent && r.pod === 'meshed' && r.concurrency > 1);
  console.log(`load average before the run: ${loadBefore.map((x) => x.toFixed(2)).join(' ')}`);
  console.log(`load average after the run: ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
  console.log(`agent socket, state records and log under ${tmpBase}${tmpBase === os.tmpdir() ? ' (no tmpfs found: state records cost more than in production)' : ' (tmpfs)'}`);
  if (e) console.log(`\nissue 19 target, eBPF meshed ADD sequential p50 <= 2.5 ms: ${e.p50 <= 2.5 ? 'met' : 'MISSED'} (${e.p50.toFixed(2)}); p99 <= 8 ms: ${e.p99 <= 8 ? 'met' : 'MISSED'} (${e.p99.toFixed(2)})`);
  if (e16) console.log(`issue 19 target, eBPF meshed ADD ${e16.concurrency} at once >= 514 ADD/s: ${e16.perSec >= 514 ? 'met' : 'MISSED'} (${e16.perSec.toFixed(0)})`);
  const data = { pods: N, concurrency: CONC, kernel: os.release(), loadBefore, loadAfter: os.loadavg(), startedAt, stateDirBase: tmpBase, results };
  if (opt.json) writeFileSync(opt.json, JSON.stringify(data, (k, v: unknown) => (k === 'samples' ? JSON.stringify(v) : v), 2).replace(/"samples": "(\[[^"]*\])"/g, '"samples": $1'));
  if (opt.plot) plotCni(data, opt.plot);
} catch (e) {
  console.error(`bench-cni: ${(e as Error).message}`);
  process.exitCode = 1;
} finally {
  const steps = await lab.close();
  for (const s of steps.filter((x) => x.error)) console.error(`bench-cni: cleanup: ${s.label}: ${s.error}`);
  stopOnSignals();
}
