#!/usr/bin/env node
// npm run bench:cni — CNI ADD latency as a container runtime sees it: from
// exec of build/bin/meshcap-cni to its exit, against a real `meshcap agent`
// (its own process, standalone, pods file), for a meshed Istio pod whose
// netns this script made, in eBPF mode and in iptables mode, sequential and
// 16-way concurrent. Also an unmeshed pod (forwarder + agent round trip, no
// datapath write) as the floor. Beside them, the same pods through the real
// istio-cni plugin (build/istio/istio-cni, `npm run build:peers`), chained
// the same way, reading each pod from a real kube-apiserver
// (test/helpers/k8s-control-plane.ts, build/k8s/bin) and applying its rules in
// the pod's netns (docs/bench-cni.md says what each column measures). DEL is
// timed too. Needs root, `npm run build` (dist/, the addon, the BPF objects)
// and build/bin/meshcap-cni.
//
//   node scripts/bench-cni.mjs [--pods 200] [--concurrency 16] [--modes ebpf,iptables,istio-cni] [--json FILE]
//
// Everything it makes (netns, pins, state, socket, the control plane) is
// removed at the end, also on Ctrl-C. Each pod netns has a veth pair (both
// ends inside it) with the pod's address (istio-cni reads it to decide IPv6): no traffic leaves
// any namespace.
import { createStepProgress } from './lib/progress.mjs';
import { execFileSync, spawn } from 'node:child_process';
import { register } from 'node:module';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const CNI = path.join(root, 'build/bin/meshcap-cni');
const MESHCAP = path.join(root, 'bin/meshcap');
const ISTIO_CNI = path.join(root, 'build/istio/istio-cni');

const { values: opt } = parseArgs({
  options: {
    pods: { type: 'string', default: '200' },
    concurrency: { type: 'string', default: '16' },
    modes: { type: 'string', default: 'ebpf,iptables,istio-cni' },
    json: { type: 'string' },
  },
});
const N = Number(opt.pods);
const CONC = Number(opt.concurrency);
const MODES = opt.modes.split(',');
if (!(N >= 1 && CONC >= 1)) throw new Error('--pods and --concurrency must be positive');
if (process.getuid?.() !== 0) throw new Error('run as root: the bench makes network namespaces and loads BPF programs');
for (const m of MODES) if (!['ebpf', 'iptables', 'istio-cni'].includes(m)) throw new Error(`--modes: unknown mode ${m} (ebpf, iptables, istio-cni)`);
for (const f of [CNI, path.join(root, 'dist/cli/main.js')]) if (!existsSync(f)) throw new Error(`${f} is missing: npm run build`);
if (MODES.includes('istio-cni') && !existsSync(ISTIO_CNI)) throw new Error(`${ISTIO_CNI} is missing: npm run build:peers (or leave istio-cni out of --modes)`);

const id = `${process.pid}`;
const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-bench-'));
const netns = [];
let agent;
let pinRoot;
let controlPlane;

function cleanup() {
  if (agent && agent.exitCode === null) agent.kill('SIGKILL');
  // the control plane's own exit hooks kill etcd and kube-apiserver and remove its dir
  controlPlane?.stop().catch(() => undefined);
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
function runCni(env, stdin, bin = CNI) {
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint();
    const p = spawn(bin, [], { env, stdio: ['pipe', 'pipe', 'ignore'] });
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

const podIP = (i) => `198.18.${100 + (i >> 8)}.${i & 255}`;
const prevResult = (ns, i) => ({ cniVersion: '1.0.0', interfaces: [{ name: 'eth0', sandbox: ns }], ips: [{ address: `${podIP(i)}/16`, interface: 0 }] });

function conf(socket, ns, i) {
  return JSON.stringify({
    cniVersion: '1.0.0', name: 'bench', type: 'meshcap-cni', agentSocket: socket, agentTimeoutMs: 30000,
    prevResult: prevResult(ns, i),
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
  const del = (tag, suffix = '', width = 16) => pool(names, width, async (pod, i) => {
    pod += suffix;
    const r = await runCni(cniEnv('DEL', socket, `${tag}${i}`, pod, nss[i]), conf(socket, nss[i], i));
    if (r.code !== 0) throw new Error(`DEL ${pod} (${mode}) failed: ${r.out}`);
    return r.ms;
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
  progress.step(`${mode}: ${N} DELs, meshed, sequential`);
  results.push({ mode, op: 'DEL', pod: 'meshed', concurrency: 1, ...(await timed(() => del('s', '', 1))) });
  progress.step(`${mode}: ${N} ADDs, ${`meshed, ${CONC} at once`}`);
  results.push({ mode, pod: 'meshed', concurrency: CONC, ...(await timed(() => add(CONC, 'c'))) });
  await del('c');

  agent.kill('SIGTERM');
  await new Promise((res) => (agent.exitCode !== null ? res() : agent.once('exit', res)));
  execFileSync(process.execPath, [MESHCAP, 'uninstall', '--pin-root', pinRoot], { stdio: 'ignore' });
  pinRoot = undefined;
}

let controlPlaneMs;

/**
 * The real istio-cni plugin on the same pods: a chained plugin after the
 * main one (the same prevResult), sidecar mode (ambient off), reading each
 * pod from a real kube-apiserver through the kubeconfig in its run dir, as
 * the istio-cni DaemonSet sets it up. Istio's DEL does nothing in sidecar
 * mode, and its rules stay in the netns (a real pod's netns goes with the
 * pod): they are flushed between rows, outside the timings.
 */
async function benchIstioCni() {
  register(new URL('../bench/lib/ts-hooks.mjs', import.meta.url));
  const { ControlPlane } = await import('../test/helpers/k8s-control-plane.ts');
  const { CoreV1Api } = await import('@kubernetes/client-node');
  const t0 = performance.now();
  controlPlane = await ControlPlane.start();
  controlPlaneMs = performance.now() - t0;
  const runDir = path.join(tmp, 'istio-cni');
  execFileSync('mkdir', ['-p', runDir]);
  writeFileSync(path.join(runDir, 'istio-cni-kubeconfig'), JSON.stringify({
    apiVersion: 'v1', kind: 'Config', 'current-context': 'bench',
    clusters: [{ name: 'bench', cluster: { server: controlPlane.apiserverUrl, 'certificate-authority': controlPlane.caFile } }],
    users: [{ name: 'bench', user: { 'client-certificate': path.join(controlPlane.pki, 'admin.crt'), 'client-key': path.join(controlPlane.pki, 'admin.key') } }],
    contexts: [{ name: 'bench', context: { cluster: 'bench', user: 'bench' } }],
  }));
  const core = controlPlane.adminKubeConfig().makeApiClient(CoreV1Api);
  await core.createNamespace({ body: { metadata: { name: 'bench' } } });
  // no controller-manager here to make the namespace's default service account, which admission wants
  await core.createNamespacedServiceAccount({ namespace: 'bench', body: { metadata: { name: 'default' } } });
  const pod = (name, meshed, noInbound = false) => ({
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

  const nss = names.map((_, i) => `/var/run/netns/mcbench-${id}-${i}`);
  const istioConf = (i) => JSON.stringify({
    cniVersion: '1.0.0', name: 'bench', type: 'istio-cni', plugin_log_level: 'info', cni_agent_run_dir: runDir,
    ambient_enabled: false, exclude_namespaces: ['kube-system'], pod_namespace: 'istio-system', prevResult: prevResult(nss[i], i),
  });
  // istio-cni runs iptables-save/-restore: it needs a PATH (a runtime passes its own)
  const env = (command, tag, name, i) => ({ ...cniEnv(command, '', tag, name, nss[i]), PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin' });
  const run = async (command, tag, name, i) => {
    const r = await runCni(env(command, tag, name, i), istioConf(i), ISTIO_CNI);
    if (r.code !== 0) throw new Error(`istio-cni ${command} ${name} failed (exit ${r.code}): ${r.out}`);
    return r.ms;
  };
  const flush = () => pool(netns, 8, (ns) => new Promise((resolve, reject) => {
    const p = spawn('ip', ['netns', 'exec', ns, 'sh', '-c',
      'for b in iptables-nft ip6tables-nft iptables-legacy ip6tables-legacy; do if $b-save 2>/dev/null | grep -q ISTIO; then printf \'*nat\\nCOMMIT\\n*mangle\\nCOMMIT\\n\' | $b-restore || exit 1; fi; done'], { stdio: 'ignore' });
    p.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`flushing Istio's rules in ${ns} failed`))));
  }));

  // the ADDs must really program (or really skip): Istio's chains in the pod netns, or none
  const istioChains = (ns) => execFileSync('ip', ['netns', 'exec', ns, 'sh', '-c', 'iptables-nft-save 2>/dev/null; iptables-legacy-save 2>/dev/null'], { encoding: 'utf8' })
    .split('\n').filter((l) => l.startsWith('-A ISTIO_')).length;
  const expectChains = (what, want) => {
    const n = istioChains(netns.at(-1));
    if (want ? n === 0 : n > 0) throw new Error(`istio-cni ${what}: ${n} ISTIO_ rules in ${netns.at(-1)}, expected ${want ? 'some' : 'none'}`);
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
  await controlPlane.stop();
  controlPlane = undefined;
}

const loadBefore = os.loadavg();
const progress = createStepProgress({ name: 'bench:cni', total: MODES.length * 5 });
try {
  for (let i = 0; i < N; i++) {
    const ns = `mcbench-${id}-${i}`;
    execFileSync('ip', ['netns', 'add', ns]);
    netns.push(ns);
    // the pod's address on a link of its own (a veth pair with both ends in
    // the pod netns: nothing can leave), as the main plugin leaves it;
    // istio-cni decides IPv6 from it
    execFileSync('ip', ['-n', ns, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'peer0']);
    execFileSync('ip', ['-n', ns, 'addr', 'add', `${podIP(i)}/16`, 'dev', 'eth0']);
    execFileSync('ip', ['-n', ns, 'link', 'set', 'eth0', 'up']);
  }
  for (const mode of MODES) await (mode === 'istio-cni' ? benchIstioCni() : benchMode(mode));
  progress.done();
  const f = (x) => x.toFixed(2).padStart(7);
  console.log(`CNI ADD/DEL, exec to exit, ${N} pods per row, ${os.cpus().length} CPUs, kernel ${os.release()}, node ${process.version}`);
  console.log(`${'mode'.padEnd(10)}${'op'.padEnd(4)}${'pod'.padEnd(12)}${'conc'.padStart(5)}${'n'.padStart(6)}   p50 ms   p90 ms   p99 ms   max ms  ops/s`);
  for (const r of results) {
    console.log(`${r.mode.padEnd(10)}${(r.op ?? 'ADD').padEnd(4)}${r.pod.padEnd(12)}${String(r.concurrency).padStart(5)}${String(r.n).padStart(6)}  ${f(r.p50)}  ${f(r.p90)}  ${f(r.p99)}  ${f(r.max)}  ${r.perSec.toFixed(0).padStart(5)}`);
  }
  if (controlPlaneMs !== undefined) console.log(`istio-cni read its pods from a real kube-apiserver (etcd + kube-apiserver started in ${(controlPlaneMs / 1000).toFixed(1)} s, not in any row)`);
  const e = results.find((r) => r.mode === 'ebpf' && r.pod === 'meshed' && r.concurrency === 1);
  console.log(`load average before the run: ${loadBefore.map((x) => x.toFixed(2)).join(' ')}`);
  if (e) console.log(`\ntarget eBPF p50 <= 5 ms: ${e.p50 <= 5 ? 'met' : 'MISSED'} (${e.p50.toFixed(2)}); p99 <= 20 ms: ${e.p99 <= 20 ? 'met' : 'MISSED'} (${e.p99.toFixed(2)})`);
  if (opt.json) writeFileSync(opt.json, JSON.stringify({ pods: N, concurrency: CONC, kernel: os.release(), loadBefore, results }, null, 2));
} finally {
  cleanup();
}
