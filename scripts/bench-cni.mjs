#!/usr/bin/env node
// npm run bench:cni — CNI ADD latency as a container runtime sees it: from
// exec of build/bin/meshcap-cni to its exit, against a real `meshcap agent`
// (its own process, standalone, pods file), for a meshed Istio pod whose
// netns this script made, in eBPF mode and in iptables mode, sequential and
// 16-way concurrent. Also an unmeshed pod (forwarder + agent round trip, no
// datapath write) as the floor. Needs root, `npm run build` (dist/, the addon,
// the BPF objects) and build/bin/meshcap-cni.
//
//   node scripts/bench-cni.mjs [--pods 200] [--concurrency 16] [--modes ebpf,iptables] [--json FILE]
//
// Everything it makes (netns, pins, state, socket) is removed at the end,
// also on Ctrl-C. Pods have no links: no traffic leaves any namespace.
import { createStepProgress } from './lib/progress.mjs';
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const CNI = path.join(root, 'build/bin/meshcap-cni');
const MESHCAP = path.join(root, 'bin/meshcap');

const { values: opt } = parseArgs({
  options: {
    pods: { type: 'string', default: '200' },
    concurrency: { type: 'string', default: '16' },
    modes: { type: 'string', default: 'ebpf,iptables' },
    json: { type: 'string' },
  },
});
const N = Number(opt.pods);
const CONC = Number(opt.concurrency);
const MODES = opt.modes.split(',');
if (!(N >= 1 && CONC >= 1)) throw new Error('--pods and --concurrency must be positive');
if (process.getuid?.() !== 0) throw new Error('run as root: the bench makes network namespaces and loads BPF programs');
for (const f of [CNI, path.join(root, 'dist/cli/main.js')]) if (!existsSync(f)) throw new Error(`${f} is missing: npm run build`);

const id = `${process.pid}`;
const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-bench-'));
const netns = [];
let agent;
let pinRoot;

function cleanup() {
  if (agent && agent.exitCode === null) agent.kill('SIGKILL');
  for (const ns of netns.splice(0)) {
    try { execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' }); } catch { /* gone */ }
  }
  if (pinRoot) {
    try { execFileSync(process.execPath, [MESHCAP, 'uninstall', '--pin-root', pinRoot], { stdio: 'ignore' }); } catch { /* nothing pinned */ }
  }
  rmSync(tmp, { recursive: true, force: true });
}
process.once('SIGINT', () => { cleanup(); process.exit(130); });
process.once('SIGTERM', () => { cleanup(); process.exit(143); });

const podYaml = (name, meshed, noInbound = false) => `apiVersion: v1
kind: Pod
metadata:
  name: ${name}
  namespace: bench
${meshed ? "  annotations:\n    sidecar.istio.io/status: '{\"containers\":[\"istio-proxy\"]}'\n" : ''}${noInbound ? "    traffic.sidecar.istio.io/includeInboundPorts: ''\n" : ''}spec:
  containers:
  - {name: app, image: app}
${meshed ? '  - {name: istio-proxy, image: proxyv2}\n' : ''}`;

/** One plugin run, timed from spawn to exit. */
function runCni(env, stdin) {
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint();
    const p = spawn(CNI, [], { env, stdio: ['pipe', 'pipe', 'ignore'] });
    let out = '';
    p.stdout.on('data', (d) => { out += d; });
    p.on('error', reject);
    p.on('exit', (code) => {
      const ms = Number(process.hrtime.bigint() - t0) / 1e6;
      resolve({ code, out, ms });
    });
    p.stdin.end(stdin);
  });
}

function cniEnv(command, socket, i, pod, ns) {
  return {
    CNI_COMMAND: command,
    CNI_CONTAINERID: `bench${i}-${pod}`,
    CNI_NETNS: ns,
    CNI_IFNAME: 'eth0',
    CNI_ARGS: `IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=${pod}`,
    CNI_PATH: '/opt/cni/bin',
  };
}

function conf(socket, ns, i) {
  return JSON.stringify({
    cniVersion: '1.0.0', name: 'bench', type: 'meshcap-cni', agentSocket: socket, agentTimeoutMs: 30000,
    prevResult: { cniVersion: '1.0.0', interfaces: [{ name: 'eth0', sandbox: ns }], ips: [{ address: `198.18.${100 + (i >> 8)}.${i & 255}/16`, interface: 0 }] },
  });
}

async function pool(items, width, fn) {
  const out = new Array(items.length);
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(width, items.length) }, async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i], i);
    }
  }));
  return out;
}

const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
function summary(ms, wallMs) {
  const s = [...ms].sort((a, b) => a - b);
  return { n: s.length, p50: pct(s, 50), p90: pct(s, 90), p99: pct(s, 99), max: s.at(-1), perSec: (s.length * 1000) / wallMs };
}
/** Runs fn, returns its latencies' summary with the row's throughput. */
async function timed(fn) {
  const t0 = performance.now();
  const ms = await fn();
  return summary(ms, performance.now() - t0);
}

async function waitReady(socket) {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (agent.exitCode !== null) throw new Error(`agent exited (${agent.exitCode}): ${agentErr}`);
    const r = await runCni({ CNI_COMMAND: 'STATUS', CNI_PATH: '/opt/cni/bin' }, JSON.stringify({ cniVersion: '1.1.0', name: 'bench', type: 'meshcap-cni', agentSocket: socket }));
    if (r.code === 0) return;
    await new Promise((res) => setTimeout(res, 100));
  }
  throw new Error('agent not ready within 60 s');
}

let agentErr = '';
const results = [];

async function benchMode(mode) {
  const dir = path.join(tmp, mode);
  const socket = path.join(dir, 'cni.sock');
  pinRoot = `/sys/fs/bpf/meshcap-bench-${id}-${mode}`;
  const names = Array.from({ length: N }, (_, i) => `pod-${i}`);
  execFileSync('mkdir', ['-p', dir]);
  writeFileSync(path.join(dir, 'pods.yaml'), [...names.map((n) => podYaml(n, true)), ...names.map((n) => podYaml(`${n}-out`, true, true)), podYaml('plain', false)].join('---\n'));
  agentErr = '';
  agent = spawn(process.execPath, [MESHCAP, 'agent', '--standalone', '--pods', path.join(dir, 'pods.yaml'), '--socket', socket,
    '--pin-root', pinRoot, '--mode', mode, '--state-dir', path.join(dir, 'state'), '--exclude-namespaces', 'kube-system'],
  { stdio: ['ignore', 'ignore', 'pipe'] }); // the agent's per-request log lines are written (to /dev/null), as in production
  agent.stderr.on('data', (d) => { agentErr += d; });
  await waitReady(socket);

  const nss = names.map((_, i) => `/var/run/netns/mcbench-${id}-${i}`);
  const add = (width, tag) => pool(names, width, async (pod, i) => {
    const r = await runCni(cniEnv('ADD', socket, `${tag}${i}`, pod, nss[i]), conf(socket, nss[i], i));
    if (r.code !== 0) throw new Error(`ADD ${pod} (${mode}) failed: ${r.out}`);
    return r.ms;
  });
  const addOutOnly = () => pool(names, 1, async (pod, i) => {
    const r = await runCni(cniEnv('ADD', socket, `o${i}`, `${pod}-out`, nss[i]), conf(socket, nss[i], i));
    if (r.code !== 0) throw new Error(`ADD ${pod}-out (${mode}) failed: ${r.out}`);
    return r.ms;
  });
  const del = (tag, suffix = '') => pool(names, 16, async (pod, i) => {
    pod += suffix;
    const r = await runCni(cniEnv('DEL', socket, `${tag}${i}`, pod, nss[i]), conf(socket, nss[i], i));
    if (r.code !== 0) throw new Error(`DEL ${pod} (${mode}) failed: ${r.out}`);
  });

  // warm-up: first requests pay for JIT and lazy module loads in the agent
  for (let i = 0; i < 5; i++) await runCni(cniEnv('ADD', socket, `w${i}`, 'plain', nss[0]), conf(socket, nss[0], 0));

  const plain = async () => {
    const ms = [];
    for (let i = 0; i < N; i++) {
      const r = await runCni(cniEnv('ADD', socket, `p${i}`, 'plain', nss[i]), conf(socket, nss[i], i));
      if (r.code !== 0) throw new Error(`ADD plain failed: ${r.out}`);
      ms.push(r.ms);
    }
    return ms;
  };
  progress.step(`${mode}: ${N} ADDs, ${'unmeshed, sequential'}`);
  results.push({ mode, pod: 'unmeshed', concurrency: 1, ...(await timed(plain)) });
  // no inbound capture: no per-pod sk_lookup program to load (eBPF), no inbound rules (iptables)
  progress.step(`${mode}: ${N} ADDs, ${'meshed outbound-only, sequential'}`);
  results.push({ mode, pod: 'meshed-out', concurrency: 1, ...(await timed(addOutOnly)) });
  await del('o', '-out');
  progress.step(`${mode}: ${N} ADDs, ${'meshed, sequential'}`);
  results.push({ mode, pod: 'meshed', concurrency: 1, ...(await timed(() => add(1, 's'))) });
  await del('s');
  progress.step(`${mode}: ${N} ADDs, ${`meshed, ${CONC} at once`}`);
  results.push({ mode, pod: 'meshed', concurrency: CONC, ...(await timed(() => add(CONC, 'c'))) });
  await del('c');

  agent.kill('SIGTERM');
  await new Promise((res) => (agent.exitCode !== null ? res() : agent.once('exit', res)));
  execFileSync(process.execPath, [MESHCAP, 'uninstall', '--pin-root', pinRoot], { stdio: 'ignore' });
  pinRoot = undefined;
}

const loadBefore = os.loadavg();
const progress = createStepProgress({ name: 'bench:cni', total: MODES.length * 4 });
try {
  for (let i = 0; i < N; i++) {
    const ns = `mcbench-${id}-${i}`;
    execFileSync('ip', ['netns', 'add', ns]);
    netns.push(ns);
  }
  for (const mode of MODES) await benchMode(mode);
  progress.done();
  const f = (x) => x.toFixed(2).padStart(7);
  console.log(`meshcap-cni ADD, exec to exit, ${N} pods per row, ${os.cpus().length} CPUs, kernel ${os.release()}, node ${process.version}`);
  console.log(`${'mode'.padEnd(9)}${'pod'.padEnd(12)}${'conc'.padStart(5)}${'n'.padStart(6)}   p50 ms   p90 ms   p99 ms   max ms  ADD/s`);
  for (const r of results) {
    console.log(`${r.mode.padEnd(9)}${r.pod.padEnd(12)}${String(r.concurrency).padStart(5)}${String(r.n).padStart(6)}  ${f(r.p50)}  ${f(r.p90)}  ${f(r.p99)}  ${f(r.max)}  ${r.perSec.toFixed(0).padStart(5)}`);
  }
  const e = results.find((r) => r.mode === 'ebpf' && r.pod === 'meshed' && r.concurrency === 1);
  console.log(`load average before the run: ${loadBefore.map((x) => x.toFixed(2)).join(' ')}`);
  if (e) console.log(`\ntarget eBPF p50 <= 5 ms: ${e.p50 <= 5 ? 'met' : 'MISSED'} (${e.p50.toFixed(2)}); p99 <= 20 ms: ${e.p99 <= 20 ? 'met' : 'MISSED'} (${e.p99.toFixed(2)})`);
  if (opt.json) writeFileSync(opt.json, JSON.stringify({ pods: N, concurrency: CONC, kernel: os.release(), results }, null, 2));
} finally {
  cleanup();
}
