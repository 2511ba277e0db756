// npm run bench:datapath — what the redirection costs a meshed pod's traffic:
// request/response on one connection (1 B and 100 B), connection rate
// (connect + one 1 B exchange + close) and stream throughput, for
//
//   noproxy      the app connects straight to the service (whole path only)
//   direct       the app connects to the proxy's address itself: the floor
//   podsrc       the same from the pod's address, as every redirect that keeps
//                it (REDIRECT, meshcap's bind) does: the floor of such a redirect
//   iptables     Istio's rules from src/fallback-iptables in the pod netns
//   ebpf         meshcap's eBPF datapath
//
// measured on two legs: "echo", the app-to-proxy leg alone (the proxy is
// mc-bench-echo, which reads SO_ORIGINAL_DST on every accept and echoes), and
// "full", the whole path (the proxy is an unmodified HAProxy from Debian
// with `server 0.0.0.0:0`, reading SO_ORIGINAL_DST and forwarding to an echo
// service in another netns over veth). The same proxy serves every mode of
// a leg; the app is mc-bench-load (one thread, per-operation latency). Modes
// are interleaved (rotated per round) so drift hits all of them alike;
// ratios are medians of per-round paired ratios. docs/bench-datapath.md.
//
//   node --import ./bench/lib/ts.mjs bench/datapath/main.ts [--rounds 5] [--seconds 0.5] [--quick]
//        [--tests rr1,rr100,crr,stream] [--legs echo,full] [--modes noproxy,direct,podsrc,iptables,ebpf]
//        [--cpus APP,PROXY,SERVER (CPU numbers or any)] [--profile TEST] [--bpf-stats TEST] [--objects DIR]
//        [--proxy-target origdst|fixed (the whole path's HAProxy in the mesh modes)]
//        [--json FILE] [--plot FILE.png (and FILE-latency.svg)]
//   ... bench/datapath/main.ts --plot-only FILE.json --plot FILE.png
//
// The parts: matrix.ts (what is measured), cells.ts (the lab and the path
// check), run.ts (tools, load runs, rounds), profile.ts (--profile),
// plot.ts (--plot), report.ts (summary, table, JSON). Needs root, the build
// (npm run build: the addon and the BPF objects), haproxy, a C compiler,
// gnuplot for --plot, perf for --profile. Everything it makes (netns, BPF
// pins, rules, processes, temp files) is in one lab (src/lab) and removed
// at the end, also on failure and Ctrl-C. Addresses are 198.18.k.0/24 on
// veth pairs between lab namespaces, with no default route.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pino, destination } from 'pino';
import { parseOptions } from '../../scripts/lib/cli-options.mjs';
import { createStepProgress } from '../../scripts/lib/progress.mjs';
import { cleanupOnSignals, Lab } from '../../src/lab/index.js';
import { projectRoot } from '../../src/paths.js';
import { LEGS, MODES, TESTS, type Leg, type Mode, type TestName } from './matrix.js';
import { plot, plotLatency } from './plot.js';
import { cgroupRootPrograms, machine, otherTests, summarize, table, toJson, type BenchData } from './report.js';

const SRC = path.join(projectRoot, 'bench/datapath');
const BIN = path.join(projectRoot, 'build/bench');
const log = pino({ name: 'bench-datapath' }, destination(2));

const opt = parseOptions(import.meta.url, 'bench:datapath', {
  rounds: { type: 'string', default: '5' },
  seconds: { type: 'string', default: '0.5' },
  warmup: { type: 'string', default: '0.1' },
  quick: { type: 'boolean', default: false },
  tests: { type: 'string', default: 'rr1,rr100,crr,stream' },
  legs: { type: 'string', default: 'echo,full' },
  modes: { type: 'string', default: MODES.join(',') },
  cpus: { type: 'string', default: '0,0,0' },
  json: { type: 'string' },
  plot: { type: 'string' },
  'plot-only': { type: 'string' },
  profile: { type: 'string' },
  'bpf-stats': { type: 'string' },
  objects: { type: 'string' },
  'proxy-target': { type: 'string', default: 'origdst' },
});

const have = (tool: string): boolean => {
  try {
    execFileSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
};

// --plot FILE.png also draws the latency distribution beside it: FILE-latency.svg.
const latencyFile = (file: string): string => file.replace(/(\.[a-z]+)?$/, '-latency.svg');

if (opt['plot-only']) {
  if (!opt.plot) throw new Error('--plot-only FILE.json needs --plot FILE.png');
  const data = JSON.parse(readFileSync(opt['plot-only'], 'utf8')) as BenchData;
  plot(data, opt.plot);
  plotLatency(data, latencyFile(opt.plot));
  console.log(table(data.summary, data.options.legs, data.options.tests, data.options.modes));
  process.exit(0);
}

// ---------------------------------------------------------------- options and preconditions

// --quick: one short round, to see the bench work end to end (about 20 s); not numbers to quote.
const ROUNDS = opt.quick ? 1 : Number(opt.rounds);
const SECONDS = opt.quick ? 0.2 : Number(opt.seconds);
const WARMUP = opt.quick ? 0.05 : Number(opt.warmup);
const tests = opt.tests.split(',') as TestName[];
const legs = opt.legs.split(',') as Leg[];
const modes = opt.modes.split(',') as Mode[];
const ncpu = os.cpus().length;
// 'any' leaves placement to the scheduler (taskset over all CPUs).
const [app = '', proxy = '', server = ''] = opt.cpus.split(',').map((c) => (c === 'any' ? `0-${ncpu - 1}` : c));
const cpus = { app, proxy, server };
if (!(ROUNDS >= 1 && SECONDS > 0 && WARMUP >= 0)) throw new Error('--rounds must be ≥ 1, --seconds > 0, --warmup ≥ 0');
for (const t of tests) if (!(t in TESTS)) throw new Error(`unknown test ${t}: choose from ${Object.keys(TESTS).join(', ')}`);
for (const l of legs) if (!(l in LEGS)) throw new Error(`unknown leg ${l}: choose from ${Object.keys(LEGS).join(', ')}`);
for (const m of modes) if (!MODES.includes(m)) throw new Error(`unknown mode ${m}: choose from ${MODES.join(', ')}`);
// --proxy-target fixed: HAProxy forwards to the service's own address in the mesh modes too, so
// no mode asks SO_ORIGINAL_DST on the whole path: the redirect's cost without the query every
// transparent proxy makes (and `direct`'s fixed server does not).
if (opt['proxy-target'] !== 'origdst' && opt['proxy-target'] !== 'fixed') throw new Error(`--proxy-target ${opt['proxy-target']}: choose origdst (the default: server 0.0.0.0:0 in the mesh modes) or fixed`);
const proxyTarget = opt['proxy-target'] as 'origdst' | 'fixed';
for (const c of [app, proxy, server]) if (!(c === `0-${ncpu - 1}` || (Number(c) >= 0 && Number(c) < ncpu))) throw new Error(`--cpus app,proxy,server: ${opt.cpus} names a CPU this machine (${ncpu} CPUs) does not have`);
if (process.getuid?.() !== 0) throw new Error('run as root: the bench makes network namespaces, loads BPF programs and applies iptables rules');
for (const f of ['build/native/Release/meshcap_native.node', 'build/bpf/outbound.bpf.o']) {
  if (!existsSync(path.join(projectRoot, f))) throw new Error(`${f} is missing: run npm run build (or npm run setup)`);
}
for (const tool of ['haproxy', 'cc', 'taskset', 'setpriv']) if (!have(tool)) throw new Error(`${tool} is not installed: run npm run setup`);
const profileTest = opt.profile as TestName | undefined;
if (profileTest !== undefined && !(profileTest in TESTS)) throw new Error(`--profile wants one test name (${Object.keys(TESTS).join(', ')})`);
if (profileTest && !have('perf')) throw new Error('--profile needs perf: apt-get install linux-perf');
if (opt.plot && !have('gnuplot')) throw new Error('--plot needs gnuplot: run npm run setup (package gnuplot-nox)');

// Loaded after the checks so a missing build fails with the message above (they load the addon).
const { loadDatapath, uninstallDatapath } = await import('../../src/loader/datapath.js');
const { EbpfBackend } = await import('../../src/pod-datapath/ebpf.js');
const { makeCells, verifyCells } = await import('./cells.js');
const { buildTools, runRounds } = await import('./run.js');
const { profileCell, profileTable } = await import('./profile.js');
const { bpfStatsCell, bpfStatsTable, enableBpfStats } = await import('./bpfstats.js');
const statsTest = opt['bpf-stats'] as TestName | undefined;
if (statsTest !== undefined && !(statsTest in TESTS)) throw new Error(`--bpf-stats wants one test name (${Object.keys(TESTS).join(', ')})`);
if (statsTest && !modes.includes('ebpf')) throw new Error('--bpf-stats measures the eBPF datapath: include ebpf in --modes');
if (statsTest && !have('bpftool')) throw new Error('--bpf-stats needs bpftool: apt-get install bpftool');

const lab = new Lab('mcb', String(process.pid));
const stopOnSignals = cleanupOnSignals(() => lab.close(), (msg) => log.warn({ event: 'interrupted' }, msg));

async function main(): Promise<void> {
  buildTools(SRC, BIN, log);
  const startedAt = new Date().toISOString();
  const loadAtStart = os.loadavg();
  const busy = otherTests();
  if (busy) log.warn({ event: 'busy', vitestProcesses: busy }, 'vitest is running on this machine: numbers will be disturbed');
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-bench-dp-'));
  lab.add(`temp dir ${tmp}`, () => rmSync(tmp, { recursive: true, force: true }));

  // Programs already at the cgroup root (someone else's datapath) run for every socket of every mode.
  const foreign = cgroupRootPrograms();
  if (foreign) log.warn({ event: 'foreign-programs', count: foreign }, 'other BPF programs are attached at the cgroup v2 root: every mode pays for them');
  // Loaded only when eBPF mode is measured: the programs sit at the cgroup root and run for the other modes' sockets too.
  let ebpf: InstanceType<typeof EbpfBackend> | null = null;
  const pinRoot = `/sys/fs/bpf/meshcap-bench-${process.pid}`;
  if (modes.includes('ebpf')) {
    lab.add(`datapath ${pinRoot}`, () => {
      const r = uninstallDatapath(pinRoot);
      if (r.leftBehind.length) throw new Error(`could not remove: ${r.leftBehind.join(', ')}`);
    });
    // --objects DIR: another build of the node objects (A/B against build/bpf, e.g. the previous commit's)
    await loadDatapath({ pinRoot, ...(opt.objects ? { objectDir: path.resolve(opt.objects) } : {}) });
    const pods = new EbpfBackend(pinRoot);
    lab.add('pod maps', () => pods.close());
    ebpf = pods;
  }

  const cells = await makeCells({ lab, legs, modes, cpus, bin: BIN, tmp, ebpf, log, proxyTarget });
  await verifyCells(cells, lab, cpus, BIN, log);

  const t0 = Date.now();
  const progress = createStepProgress({ name: 'bench:datapath', total: ROUNDS * tests.length * cells.length + (profileTest ? cells.length : 0) + (statsTest ? cells.length : 0) });
  const results = await runRounds({ lab, bin: BIN, cpus, cells, legs, tests, rounds: ROUNDS, seconds: SECONDS, warmup: WARMUP, progress, log });
  let profile = null;
  if (profileTest) {
    profile = [];
    for (const cell of cells) {
      progress.step(`profile ${profileTest} ${cell.leg} leg, ${cell.mode}`);
      profile.push(await profileCell({ lab, bin: BIN, cpus, tmp, seconds: SECONDS }, cell, profileTest));
    }
  }
  let bpfStats = null;
  if (statsTest) {
    enableBpfStats(lab);
    bpfStats = [];
    for (const cell of cells) {
      progress.step(`bpf-stats ${statsTest} ${cell.leg} leg, ${cell.mode}`);
      bpfStats.push(await bpfStatsCell({ lab, bin: BIN, cpus, seconds: SECONDS, pinRoot }, cell, statsTest));
    }
  }
  progress.done();

  const summary = summarize(results);
  const data: BenchData = {
    startedAt, finishedAt: new Date().toISOString(), durationS: Math.round((Date.now() - t0) / 1000),
    machine: machine(),
    options: { rounds: ROUNDS, seconds: SECONDS, warmup: WARMUP, tests, legs, modes, cpus, proxyTarget },
    otherTests: { atStart: busy, atEnd: otherTests() },
    foreignCgroupPrograms: foreign,
    paths: cells.map((c) => ({ leg: c.leg, mode: c.mode, target: `${c.target.host}:${c.target.port}`, tcpSegsPerExchange: c.segsPerOp })),
    // the per-round distributions are summarized (summary[].cdfUs), not stored
    summary, results: results.map(({ cdf: _cdf, ...r }) => r), profile, bpfStats,
    loadAvg: { atStart: loadAtStart, atEnd: os.loadavg() },
  };
  console.log(table(summary, legs, tests, modes));
  if (profile && profileTest) console.log(profileTable(profile, profileTest));
  if (bpfStats) console.log(bpfStatsTable(bpfStats));
  console.log(`\nload average: ${loadAtStart.map((x) => x.toFixed(2)).join(' ')} at start, ${os.loadavg().map((x) => x.toFixed(2)).join(' ')} at end (${ncpu} CPUs)`);
  if (data.otherTests.atStart || data.otherTests.atEnd) console.log('\nwarning: vitest was running on this machine during the run; rerun on a quiet machine for numbers to quote');
  const jsonFile = opt.json ?? path.join(BIN, `datapath-${startedAt.replace(/[:.]/g, '-')}.json`);
  writeFileSync(jsonFile, toJson(data));
  log.info({ event: 'written', json: jsonFile });
  if (opt.plot) {
    plot(data, opt.plot);
    plotLatency(data, latencyFile(opt.plot));
    log.info({ event: 'written', plot: opt.plot, latency: latencyFile(opt.plot) });
  }
}

try {
  await main();
} catch (e) {
  log.error({ event: 'failed', err: (e as Error).message });
  console.error(`bench-datapath: ${(e as Error).message}`);
  process.exitCode = 1;
} finally {
  const steps = await lab.close();
  for (const s of steps.filter((x) => x.error)) log.error({ event: 'cleanup-failed', step: s.label, err: s.error }, `cleanup: ${s.label}: ${s.error}`);
  stopOnSignals();
}
