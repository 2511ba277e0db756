// npm run bench:capacity — how many outbound connections one pod can hold at
// once, and how fast it can open them when the app closes first (TIME_WAIT on
// the app's side), for
//
//   direct     no capture: the app connects to the destinations themselves
//   iptables   Istio's rules from src/fallback-iptables in the pod netns
//   ebpf       meshcap's eBPF datapath
//
// side by side in one run, issue 19 item 4. The app (mc-capacity hold|churn)
// connects round-robin to N destinations 198.18.k.11.. (with --family 6:
// 2001:db8:k::11.., the pod's IPv6 captured as Istio's dual stack) (a sink in a server
// netns behind a veth pair, no default route anywhere); in the mesh modes the
// proxy is a sink on 0.0.0.0:15001 (uid 1337) that reads SO_ORIGINAL_DST on
// every accepted socket, holds it, echoes 1 B and closes on EOF; it does not
// forward (its upstream leg would be the same in every mode: the proxy's own
// connections are not captured). Every (test, mode) gets fresh namespaces, so
// no TIME_WAIT of one run counts against the next. Pod sysctls are the
// kernel's defaults, set explicitly where they matter: net.ipv4.tcp_tw_reuse=2
// (reuse for loopback only) and the default ip_local_port_range is read and
// reported; net.core.somaxconn is raised in the pod and server so accept
// queues are not what is measured.
//
//   node --import ./bench/lib/ts.mjs bench/capacity/main.ts [--dests 2] [--tests hold,churn] [--family 4|6]
//        [--modes direct,iptables,ebpf] [--hold-seconds 150] [--churn-seconds 20] [--conc 64] [--json FILE]
//
// Needs root and the build (the addon and the BPF objects); compiles
// mc-capacity.c into build/bench. Everything it makes is in src/lab labs and
// removed at the end, also on failure and Ctrl-C. docs/bench-capacity.md.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { pino, destination } from 'pino';
import { cleanupOnSignals, Lab, type Proc } from '../../src/lab/index.js';
import { projectRoot } from '../../src/paths.js';
import { podToCaptureConfig } from '../../src/redirect/pod.js';
import { summarizeTuples, type TupleSummary } from './tuples.js';
import { parseOptions } from '../../scripts/lib/cli-options.mjs';

const SRC = path.join(projectRoot, 'bench/capacity/mc-capacity.c');
const BIN = path.join(projectRoot, 'build/bench/mc-capacity');
const PROXY_UID = 1337;
const PROXY_PORT = 15001;
const SVC_PORT = 8080;
const log = pino({ name: 'bench-capacity' }, destination(2));

const MODES = ['direct', 'iptables', 'ebpf'] as const;
type Mode = (typeof MODES)[number];
const TESTS = ['hold', 'churn'] as const;
type Test = (typeof TESTS)[number];

const opt = parseOptions(import.meta.url, 'bench:capacity', {
  dests: { type: 'string', default: '2' },
  'hold-seconds': { type: 'string', default: '150' },
  tests: { type: 'string', default: TESTS.join(',') },
  modes: { type: 'string', default: MODES.join(',') },
  'churn-seconds': { type: 'string', default: '20' },
  conc: { type: 'string', default: '64' },
  family: { type: 'string', default: '4' },
  json: { type: 'string' },
});
if (opt.family !== '4' && opt.family !== '6') throw new Error('--family 4 or 6');
const V6 = opt.family === '6';
const NDST = Number(opt.dests);
const CHURN_S = Number(opt['churn-seconds']);
const HOLD_S = Number(opt['hold-seconds']);
const CONC = Number(opt.conc);
const modes = opt.modes.split(',') as Mode[];
const tests = opt.tests.split(',') as Test[];
if (!(Number.isInteger(NDST) && NDST >= 1 && NDST <= 40)) throw new Error('--dests must be 1..40');
if (!(HOLD_S >= 5 && HOLD_S <= 600)) throw new Error('--hold-seconds 5..600');
if (!(CHURN_S >= 2 && CHURN_S <= 600 && CONC >= 1 && CONC <= 4096)) throw new Error('--churn-seconds 2..600, --conc 1..4096');
for (const m of modes) if (!MODES.includes(m)) throw new Error(`unknown mode ${m}: ${MODES.join(', ')}`);
for (const t of tests) if (!TESTS.includes(t)) throw new Error(`unknown test ${t}: ${TESTS.join(', ')}`);
if (process.getuid?.() !== 0) throw new Error('run as root: the bench makes network namespaces, loads BPF programs and applies iptables rules');
for (const f of ['build/native/Release/meshcap_native.node', 'build/bpf/outbound.bpf.o']) {
  if (!existsSync(path.join(projectRoot, f))) throw new Error(`${f} is missing: run npm run build (or npm run setup)`);
}

const { loadDatapath, uninstallDatapath } = await import('../../src/loader/datapath.js');
const { EbpfBackend } = await import('../../src/pod-datapath/ebpf.js');
const { applyCapture } = await import('../../src/fallback-iptables/apply.js');

/** One pod: its netns, its server netns, the sinks. */
interface Pod {
  lab: Lab;
  ns: string;
  podIP: string;
  dests: string[];
  server: Proc;
  proxy: Proc | null;
  cookie: bigint | null;
}

function buildTool(): void {
  mkdirSync(path.dirname(BIN), { recursive: true });
  if (existsSync(BIN) && statSync(BIN).mtimeMs >= statSync(SRC).mtimeMs) return;
  execFileSync('cc', ['-O2', '-Wall', '-Wextra', '-o', BIN, SRC], { stdio: 'inherit' });
  log.info({ event: 'compiled', tool: BIN });
}

function istioPodConfig(ip: string) {
  // IPv6: captured as under Istio's dual stack (ISTIO_DUAL_STACK / EnableIPv6)
  const pod = {
    apiVersion: 'v1', kind: 'Pod',
    metadata: { name: 'capacity', namespace: 'bench', annotations: { 'sidecar.istio.io/status': '{"containers":["istio-proxy"]}' } },
    spec: { containers: [{ name: 'app', image: 'app' }, { name: 'istio-proxy', image: 'proxyv2' }] },
    status: { podIPs: [{ ip }] },
  };
  return podToCaptureConfig(pod, 'istio', { enableIPv6: V6 });
}

const sysctl = (lab: Lab, ns: string, ...kv: string[]) => execa('ip', lab.argv(ns, ['sysctl', '-q', '-w', ...kv]));

let podSeq = 0;
async function makePod(mode: Mode, ebpf: InstanceType<typeof EbpfBackend> | null, tmp: string): Promise<Pod> {
  const k = 60 + podSeq++;
  // short names: the veth names (prefix + id + n + a/b) must fit IFNAMSIZ
  const lab = new Lab('mcc', `${k}${process.pid % 100000}`);
  try {
    const ns = await lab.netns('pod');
    const srv = await lab.netns('srv');
    const podIP = V6 ? `2001:db8:${k}::2` : `198.18.${k}.2`;
    const dests = Array.from({ length: NDST }, (_, i) => (V6 ? `2001:db8:${k}::${(11 + i).toString(16)}` : `198.18.${k}.${11 + i}`));
    if (V6) await lab.link(ns.name, srv.name, { a6: [`${podIP}/64`], b6: [`2001:db8:${k}::1/64`, ...dests.map((d) => `${d}/64`)] });
    else await lab.link(ns.name, srv.name, { a4: [`${podIP}/24`], b4: [`198.18.${k}.1/24`, ...dests.map((d) => `${d}/24`)] });
    // tcp_tw_reuse=2 is the kernel's default (reuse a TIME_WAIT port for loopback connections only): set, not assumed.
    await sysctl(lab, ns.name, 'net.ipv4.tcp_tw_reuse=2', 'net.core.somaxconn=65535');
    await sysctl(lab, srv.name, 'net.core.somaxconn=65535');
    const any = V6 ? '[::]' : '0.0.0.0';
    const server = lab.start(`server-${mode}`, srv.name, [BIN, 'sink', '--listen', `${any}:${SVC_PORT}`]);
    await server.waitFor(/"event":"ready"/, 5000);
    let proxy: Proc | null = null;
    if (mode !== 'direct') {
      proxy = lab.start(`proxy-${mode}`, ns.name, [BIN, 'sink', '--listen', `${any}:${PROXY_PORT}`, '--uid', String(PROXY_UID), '--expect', `${dests.join(',')}:${SVC_PORT}`]);
      await proxy.waitFor(/"event":"ready"/, 5000);
    }
    const config = istioPodConfig(podIP);
    let cookie: bigint | null = null;
    if (mode === 'iptables') await applyCapture(ns.path, config, { lockDir: path.join(tmp, 'xtables'), logger: log });
    if (mode === 'ebpf') {
      if (!ebpf) throw new Error('eBPF mode without the datapath loaded');
      cookie = await ebpf.register({ netns: ns.path, config, podIPs: [podIP] });
      const c = cookie;
      lab.add(`pod ${c} in the eBPF maps`, () => ebpf.remove(c));
    }
    return { lab, ns: ns.name, podIP, dests, server, proxy, cookie };
  } catch (e) {
    await lab.close();
    throw e;
  }
}

async function sinkStats(p: Proc): Promise<{ accepted: number; open: number; origdst_ok: number; origdst_bad: number; origdst_fail: number; local_addrs: number; local_sample: string[] }> {
  const answer = p.nextLine(/"event":"stats"/, 10000);
  p.signal('SIGUSR1');
  return JSON.parse(await answer);
}

async function sockets(lab: Lab, ns: string): Promise<string> {
  const { stdout } = await execa('ip', lab.argv(ns, ['ss', '-Htn', 'state', 'established']), { maxBuffer: 256 << 20 });
  return stdout;
}

interface HoldResult {
  mode: Mode;
  established: number;
  failed: number;
  seconds: number;
  perDst: number[];
  establishedBySecond: number[];
  procsAtFdLimit: number;
  errors: Record<string, number>;
  proxy: Awaited<ReturnType<typeof sinkStats>> | null;
  server: Awaited<ReturnType<typeof sinkStats>>;
  tuples: TupleSummary;
  redirected: number | null;
}

async function runHold(pod: Pod, mode: Mode, ebpf: InstanceType<typeof EbpfBackend> | null): Promise<HoldResult> {
  const app = pod.lab.start(`hold-${mode}`, pod.ns, [BIN, 'hold', '--dst', `${pod.dests.join(',')}:${SVC_PORT}`, '--seconds', String(HOLD_S)], { graceMs: 20000 });
  const r = JSON.parse(await app.waitFor(/"event":"result"/, (HOLD_S + 60) * 1000)) as Omit<HoldResult, 'mode' | 'proxy' | 'server' | 'tuples' | 'redirected'>;
  // let the sinks accept what is still in their queues
  await new Promise((res) => setTimeout(res, 1000));
  const proxy = pod.proxy ? await sinkStats(pod.proxy) : null;
  const server = await sinkStats(pod.server);
  const tuples = summarizeTuples(await sockets(pod.lab, pod.ns), pod.podIP, PROXY_PORT);
  const redirected = mode === 'ebpf' && ebpf && pod.cookie !== null ? Number(ebpf.stats(pod.cookie)?.outbound ?? 0) : null;
  await app.stop(20000);
  return { mode, ...r, proxy, server, tuples, redirected };
}

interface ChurnResult {
  mode: Mode;
  completed: number;
  seconds: number;
  perSecond: number[];
  failedPerSecond: number[];
  errors: Record<string, number>;
  rate: { first5s: number; last10s: number; mean: number };
  proxy: Awaited<ReturnType<typeof sinkStats>> | null;
  server: Awaited<ReturnType<typeof sinkStats>>;
  timeWait: number;
}

async function runChurn(pod: Pod, mode: Mode): Promise<ChurnResult> {
  const cmd = [BIN, 'churn', '--dst', `${pod.dests.join(',')}:${SVC_PORT}`, '--seconds', String(CHURN_S), '--conc', String(CONC)];
  const { stdout } = await execa('ip', pod.lab.argv(pod.ns, cmd), { timeout: (CHURN_S + 30) * 1000 });
  const r = JSON.parse(stdout) as Omit<ChurnResult, 'mode' | 'rate' | 'proxy' | 'server' | 'timeWait'>;
  const mean = (a: number[]) => (a.length ? Math.round(a.reduce((x, y) => x + y, 0) / a.length) : 0);
  const rate = { first5s: mean(r.perSecond.slice(0, 5)), last10s: mean(r.perSecond.slice(-10)), mean: Math.round(r.completed / r.seconds) };
  await new Promise((res) => setTimeout(res, 500));
  const proxy = pod.proxy ? await sinkStats(pod.proxy) : null;
  const server = await sinkStats(pod.server);
  const { stdout: tw } = await execa('ip', pod.lab.argv(pod.ns, ['ss', '-Htn', 'state', 'time-wait']), { maxBuffer: 256 << 20 });
  return { mode, ...r, rate, proxy, server, timeWait: tw ? tw.split('\n').length : 0 };
}

/** The traffic took the path its mode names: all of it through the proxy with the right SO_ORIGINAL_DST, or none of it. */
function checkPath(mode: Mode, what: string, count: number, proxy: HoldResult['proxy'], server: HoldResult['server']): string[] {
  const bad: string[] = [];
  if (mode === 'direct') {
    if (server.accepted < count) bad.push(`${what}: the destinations accepted ${server.accepted} of ${count}`);
  } else {
    if (!proxy) return [`${what}: no proxy`];
    if (server.accepted !== 0) bad.push(`${what}: ${server.accepted} connections bypassed the proxy`);
    if (proxy.accepted < count) bad.push(`${what}: the proxy accepted ${proxy.accepted} of ${count}`);
    if (proxy.origdst_ok !== proxy.accepted) bad.push(`${what}: SO_ORIGINAL_DST right for ${proxy.origdst_ok} of ${proxy.accepted} (wrong ${proxy.origdst_bad}, failed ${proxy.origdst_fail})`);
  }
  return bad;
}

function portRange(): string {
  return readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().replace(/\s+/, '-');
}

function table(hold: HoldResult[], churn: ChurnResult[]): string {
  const rows: string[] = [];
  if (hold.length) {
    rows.push(`max concurrent outbound connections, one pod, ${NDST} IPv${opt.family} destinations (ephemeral ports ${portRange()})`);
    rows.push(`mode      established  stop reason                       app sockets by destination             proxy sockets by local address`);
    for (const h of hold) {
      const reason = h.procsAtFdLimit ? 'descriptor limit (raise --procs)' : h.seconds >= HOLD_S - 0.5 ? `${HOLD_S} s limit, still rising` :
        Object.entries(h.errors).map(([e, n]) => `${e} ${n}`).join(', ') || 'none';
      rows.push(`${h.mode.padEnd(9)} ${String(h.established).padStart(11)}  ${reason.padEnd(33)} ${h.tuples.appByRemote.length} x ~${Math.round(h.tuples.app / Math.max(1, h.tuples.appByRemote.length))}`.padEnd(100) +
        ` ${h.tuples.proxyByLocal.length ? `${h.tuples.proxyByLocal.length} x ~${Math.round(h.tuples.proxy / h.tuples.proxyByLocal.length)}` : '-'}`);
    }
  }
  if (churn.length) {
    rows.push('', `connection rate under churn (connect, 1 B echo, app closes first), IPv${opt.family}, ${CONC} at a time, ${CHURN_S} s, tcp_tw_reuse=2`);
    rows.push('mode      completed   conn/s first 5 s   conn/s last 10 s   mean conn/s   failed attempts');
    for (const c of churn) {
      const failed = Object.entries(c.errors).map(([e, n]) => `${e} ${n}`).join(', ') || 'none';
      rows.push(`${c.mode.padEnd(9)} ${String(c.completed).padStart(9)}   ${String(c.rate.first5s).padStart(16)}   ${String(c.rate.last10s).padStart(16)}   ${String(c.rate.mean).padStart(11)}   ${failed}`);
    }
  }
  return rows.join('\n');
}

const base = new Lab('mccb', String(process.pid));
// the lab of the (test, mode) under way, for Ctrl-C and failures
const run: { lab: Lab | null } = { lab: null };
const stopOnSignals = cleanupOnSignals(async () => {
  await run.lab?.close();
  await base.close();
}, (msg) => log.warn({ event: 'interrupted' }, msg));

async function main(): Promise<void> {
  buildTool();
  const startedAt = new Date().toISOString();
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-bench-cap-'));
  base.add(`temp dir ${tmp}`, () => rmSync(tmp, { recursive: true, force: true }));
  let ebpf: InstanceType<typeof EbpfBackend> | null = null;
  if (modes.includes('ebpf')) {
    const pinRoot = `/sys/fs/bpf/meshcap-bench-cap-${process.pid}`;
    base.add(`datapath ${pinRoot}`, () => {
      const r = uninstallDatapath(pinRoot);
      if (r.leftBehind.length) throw new Error(`could not remove: ${r.leftBehind.join(', ')}`);
    });
    await loadDatapath({ pinRoot });
    const b = new EbpfBackend(pinRoot);
    base.add('pod maps', () => b.close());
    ebpf = b;
  }
  const hold: HoldResult[] = [];
  const churn: ChurnResult[] = [];
  const problems: string[] = [];
  for (const test of tests) {
    for (const mode of modes) {
      const pod = await makePod(mode, ebpf, tmp);
      run.lab = pod.lab;
      try {
        log.info({ event: 'run', test, mode, netns: pod.ns, dests: pod.dests });
        if (test === 'hold') {
          const h = await runHold(pod, mode, ebpf);
          problems.push(...checkPath(mode, `hold/${mode}`, h.established, h.proxy, h.server));
          log.info({ event: 'hold', mode, established: h.established, errors: h.errors, tuples: { app: h.tuples.appByRemote.slice(0, 8), proxy: h.tuples.proxyByLocal.slice(0, 8) } });
          hold.push(h);
        } else {
          const c = await runChurn(pod, mode);
          problems.push(...checkPath(mode, `churn/${mode}`, c.completed, c.proxy, c.server));
          log.info({ event: 'churn', mode, completed: c.completed, rate: c.rate, errors: c.errors, timeWait: c.timeWait });
          churn.push(c);
        }
      } finally {
        const steps = await pod.lab.close();
        run.lab = null;
        for (const s of steps.filter((x) => x.error)) log.error({ event: 'cleanup-failed', step: s.label, err: s.error });
      }
    }
  }
  const data = {
    startedAt, finishedAt: new Date().toISOString(),
    machine: { kernel: os.release(), cpus: os.cpus().length, loadavg: os.loadavg() },
    // which connect4 program eBPF mode ran (before/after a datapath change)
    outboundObjectSha256: createHash('sha256').update(readFileSync(path.join(projectRoot, 'build/bpf/outbound.bpf.o'))).digest('hex').slice(0, 16),
    options: { family: Number(opt.family), dests: NDST, tests, modes, holdSeconds: HOLD_S, churnSeconds: CHURN_S, conc: CONC, ipLocalPortRange: portRange(), tcpTwReuse: 2 },
    hold, churn, problems,
  };
  console.log(table(hold, churn));
  if (problems.length) {
    console.log(`\nPATH CHECK FAILED:\n  ${problems.join('\n  ')}`);
    process.exitCode = 1;
  }
  const jsonFile = opt.json ?? path.join(path.dirname(BIN), `capacity-${startedAt.replace(/[:.]/g, '-')}.json`);
  writeFileSync(jsonFile, JSON.stringify(data, null, 1) + '\n');
  log.info({ event: 'written', json: jsonFile });
}

try {
  await main();
} catch (e) {
  log.error({ event: 'failed', err: (e as Error).message });
  console.error(`bench-capacity: ${(e as Error).message}`);
  process.exitCode = 1;
} finally {
  await run.lab?.close();
  const steps = await base.close();
  for (const s of steps.filter((x) => x.error)) log.error({ event: 'cleanup-failed', step: s.label, err: s.error }, `cleanup: ${s.label}: ${s.error}`);
  stopOnSignals();
}
