#!/usr/bin/env node
// npm run bench:datapath — what the redirection costs a meshed pod's traffic:
// request/response on one connection (1 B and 100 B), connection rate
// (connect + one 1 B exchange + close) and stream throughput, for
//
//   noproxy      the app connects straight to the service (whole path only)
//   direct       the app connects to the proxy's address itself: the floor
//   iptables     Istio's rules from src/fallback-iptables in the pod netns
//   ebpf         meshcap's eBPF datapath, splice off (the default)
//   ebpf-splice  meshcap's eBPF datapath, sk_msg splice switched on explicitly
//                (experimental, off by default: it can reorder bytes, issue 20)
//
// measured on two legs: "echo", the app-to-proxy leg alone (the proxy is
// bench/datapath/mc-bench-echo, which reads SO_ORIGINAL_DST on every accept
// and echoes), and "full", the whole path (the proxy is an unmodified HAProxy
// from Debian with `server 0.0.0.0:0`, reading SO_ORIGINAL_DST and forwarding
// to an echo service in another netns over veth). The same proxy serves
// every mode of a leg; the app is bench/datapath/mc-bench-load (one thread,
// per-operation latency). Modes are interleaved (rotated per round) so drift
// hits all of them alike; ratios are medians of per-round paired ratios.
//
//   node scripts/bench-datapath.mjs [--rounds 5] [--seconds 0.5] [--tests rr1,rr100,crr,stream]
//        [--legs echo,full] [--modes noproxy,direct,iptables,ebpf,ebpf-splice]
//        [--cpus APP,PROXY,SERVER (CPU numbers or any)] [--profile TEST]
//        [--json FILE] [--plot FILE.png]
//   node scripts/bench-datapath.mjs --plot-only FILE.json --plot FILE.png
//
// Needs root, `npm run build` (dist/, the addon, the BPF objects), haproxy, a
// C compiler, gnuplot for --plot. Everything it makes (netns, BPF pins, rules,
// processes, temp files) is removed at the end, also on Ctrl-C. Addresses are
// 198.18.k.0/24 on veth pairs between test namespaces, with no default route.
import { createStepProgress } from './lib/progress.mjs';
import { execFile, execFileSync, spawn } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { parseArgs, promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';

const run = promisify(execFile);
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const SRC = path.join(root, 'bench/datapath');
const BIN = path.join(root, 'build/bench');
const PROXY_UID = 1337;
const log = pino({ name: 'bench-datapath' }, pino.destination(2));

const { values: opt } = parseArgs({
  options: {
    rounds: { type: 'string', default: '5' },
    seconds: { type: 'string', default: '0.5' },
    warmup: { type: 'string', default: '0.1' },
    tests: { type: 'string', default: 'rr1,rr100,crr,stream' },
    legs: { type: 'string', default: 'echo,full' },
    modes: { type: 'string', default: 'noproxy,direct,iptables,ebpf,ebpf-splice' },
    cpus: { type: 'string', default: '0,0,0' },
    json: { type: 'string' },
    plot: { type: 'string' },
    'plot-only': { type: 'string' },
    profile: { type: 'string' },
  },
});

const TESTS = {
  rr1: { test: 'rr', size: 1, label: 'rr 1 B' },
  rr100: { test: 'rr', size: 100, label: 'rr 100 B' },
  crr: { test: 'crr', size: 1, label: 'crr' },
  stream: { test: 'stream', size: 1, label: 'stream' },
};
const ALL_MODES = ['noproxy', 'direct', 'iptables', 'ebpf', 'ebpf-splice'];
const LEGS = {
  echo: 'app-to-proxy leg (the proxy echoes)',
  full: 'whole path (HAProxy forwards to a server in another netns)',
};

// ---------------------------------------------------------------- summary math

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

/** Medians per (leg, test, mode), and per-round paired ratios to direct, iptables and noproxy. */
function summarize(results) {
  const key = (r) => `${r.leg}/${r.testName}/${r.mode}`;
  const byKey = new Map();
  for (const r of results) {
    if (!byKey.has(key(r))) byKey.set(key(r), []);
    byKey.get(key(r)).push(r);
  }
  const rate = (r) => (r.test === 'stream' ? r.gbitPerSec : r.opsPerSec);
  const out = [];
  for (const [k, rs] of byKey) {
    const [leg, testName, mode] = k.split('/');
    const rates = rs.map(rate);
    const ratio = (ref) => {
      const refs = byKey.get(`${leg}/${testName}/${ref}`);
      if (!refs) return null;
      const paired = rs.map((r) => {
        const o = refs.find((x) => x.round === r.round);
        return o ? rate(r) / rate(o) : null;
      }).filter((x) => x !== null);
      return paired.length ? { median: median(paired), min: Math.min(...paired), max: Math.max(...paired) } : null;
    };
    out.push({
      leg, testName, mode, test: rs[0].test, size: rs[0].size, rounds: rs.length,
      unit: rs[0].test === 'stream' ? 'Gbit/s' : 'ops/s',
      rate: median(rates), rateMin: Math.min(...rates), rateMax: Math.max(...rates),
      p50us: median(rs.map((r) => r.p50us)), p99us: median(rs.map((r) => r.p99us)),
      vsDirect: ratio('direct'), vsIptables: ratio('iptables'), vsNoproxy: ratio('noproxy'),
    });
  }
  return out;
}

function table(summary, legs, tests, modes) {
  const lines = [];
  const f = (x, d = 0) => (x === null || x === undefined ? '-' : x.toLocaleString('en-US', { minimumFractionDigits: d, maximumFractionDigits: d }));
  const r = (x) => (x ? `${x.median.toFixed(2)}×` : '-');
  for (const leg of legs) {
    lines.push('', `== ${LEGS[leg]}`);
    for (const t of tests) {
      const rows = modes.map((m) => summary.find((s) => s.leg === leg && s.testName === t && s.mode === m)).filter(Boolean);
      if (!rows.length) continue;
      const stream = rows[0].test === 'stream';
      lines.push(`-- ${TESTS[t].label}`);
      lines.push(`${'mode'.padEnd(12)} ${(stream ? 'Gbit/s' : 'ops/s').padStart(9)} ${'spread'.padStart(7)} ${'p50 µs'.padStart(8)} ${'p99 µs'.padStart(8)} ${'×direct'.padStart(8)} ${'×iptables'.padStart(9)}`);
      for (const s of rows) {
        const spread = s.rate ? `±${(((s.rateMax - s.rateMin) / 2 / s.rate) * 100).toFixed(1)}%` : '-';
        lines.push([
          s.mode.padEnd(12),
          (stream ? f(s.rate, 2) : f(s.rate)).padStart(9),
          spread.padStart(7),
          (stream ? '-' : f(s.p50us, 1)).padStart(8),
          (stream ? '-' : f(s.p99us, 1)).padStart(8),
          r(s.vsDirect).padStart(8),
          r(s.vsIptables).padStart(9),
        ].join(' '));
      }
    }
  }
  return lines.join('\n');
}

/** Two panels (legs), bars per test and mode: median rate relative to iptables mode, whiskers min..max of the paired ratios. */
function plot(data, file) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'meshcap-plot-'));
  try {
    const modes = data.options.modes;
    const legs = data.options.legs;
    const tests = data.options.tests;
    const panels = [];
    for (const leg of legs) {
      const dat = path.join(dir, `${leg}.dat`);
      const rows = tests.map((t) => {
        const cells = modes.map((m) => {
          const s = data.summary.find((x) => x.leg === leg && x.testName === t && x.mode === m);
          const v = s?.vsIptables;
          return v ? `${v.median} ${v.min} ${v.max}` : 'NaN NaN NaN';
        });
        return `"${TESTS[t].label}" ${cells.join(' ')}`;
      });
      writeFileSync(dat, rows.join('\n') + '\n');
      const cols = modes.map((m, i) => {
        const used = data.summary.some((x) => x.leg === leg && x.mode === m);
        return used ? `'${dat}' using ${2 + i * 3}:${3 + i * 3}:${4 + i * 3}:xtic(1) title '${m}' lc ${i + 1}` : null;
      }).filter(Boolean);
      panels.push(`set title "${LEGS[leg]}"\nplot ${cols.join(', \\\n  ')}, 1 notitle dt 2 lc 'black'`);
    }
    const m = data.machine;
    const engaged = Object.values(data.splice ?? {}).some((x) => x.engaged);
    const spliceNote = engaged ? 'ebpf-splice: as loaded by meshcap' : 'ebpf-splice: as loaded by meshcap, NOT moving bytes';
    const gp = [
      `set terminal pngcairo noenhanced size ${560 * legs.length},560 font 'sans,10'`,
      `set output '${path.resolve(file)}'`,
      `set multiplot layout 1,${legs.length} title "meshcap datapath: rate relative to iptables mode (median of ${data.options.rounds} interleaved rounds, whiskers min..max)\\n${m.cpu} ×${m.cpus}, Linux ${m.kernel}, ${m.haproxy}; ${spliceNote}"`,
      'set style data histogram',
      'set style histogram errorbars gap 1 lw 1',
      'set style fill solid 0.8 border -1',
      'set yrange [0:*]',
      'set ylabel "× iptables"',
      'set grid ytics',
      'set key below horizontal',
      ...panels,
      'unset multiplot',
    ].join('\n');
    const script = path.join(dir, 'plot.gp');
    writeFileSync(script, gp + '\n');
    execFileSync('gnuplot', [script], { stdio: ['ignore', 'ignore', 'pipe'] });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

if (opt['plot-only']) {
  if (!opt.plot) throw new Error('--plot-only FILE.json needs --plot FILE.png');
  const data = JSON.parse(readFileSync(opt['plot-only'], 'utf8'));
  plot(data, opt.plot);
  console.log(table(data.summary, data.options.legs, data.options.tests, data.options.modes));
  process.exit(0);
}

// ---------------------------------------------------------------- options and preconditions

const ROUNDS = Number(opt.rounds);
const SECONDS = Number(opt.seconds);
const WARMUP = Number(opt.warmup);
const tests = opt.tests.split(',');
const legs = opt.legs.split(',');
const modes = opt.modes.split(',');
const ncpu = os.cpus().length;
// 'any' leaves placement to the scheduler (taskset over all CPUs).
const [APP_CPU, PROXY_CPU, SERVER_CPU] = opt.cpus.split(',').map((c) => (c === 'any' ? `0-${ncpu - 1}` : c));
if (!(ROUNDS >= 1 && SECONDS > 0 && WARMUP >= 0)) throw new Error('--rounds must be ≥ 1, --seconds > 0, --warmup ≥ 0');
for (const t of tests) if (!TESTS[t]) throw new Error(`unknown test ${t}: choose from ${Object.keys(TESTS).join(', ')}`);
for (const l of legs) if (!LEGS[l]) throw new Error(`unknown leg ${l}: choose from ${Object.keys(LEGS).join(', ')}`);
for (const m of modes) if (!ALL_MODES.includes(m)) throw new Error(`unknown mode ${m}: choose from ${ALL_MODES.join(', ')}`);
for (const c of [APP_CPU, PROXY_CPU, SERVER_CPU]) if (!(c === `0-${ncpu - 1}` || (Number(c) >= 0 && Number(c) < ncpu))) throw new Error(`--cpus app,proxy,server: ${opt.cpus} names a CPU this machine (${ncpu} CPUs) does not have`);
if (process.getuid?.() !== 0) throw new Error('run as root: the bench makes network namespaces, loads BPF programs and applies iptables rules');
for (const f of ['dist/loader/datapath.js', 'build/bpf/outbound.bpf.o']) {
  if (!existsSync(path.join(root, f))) throw new Error(`${f} is missing: run npm run build (or npm run setup)`);
}
for (const tool of ['haproxy', 'cc', 'taskset', 'setpriv']) {
  try { execFileSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' }); } catch { throw new Error(`${tool} is not installed: run npm run setup`); }
}
if (opt.profile && !TESTS[opt.profile]) throw new Error(`--profile wants one test name (${Object.keys(TESTS).join(', ')})`);
if (opt.profile) {
  try { execFileSync('sh', ['-c', 'command -v perf'], { stdio: 'ignore' }); } catch { throw new Error('--profile needs perf: apt-get install linux-perf'); }
}
if (opt.plot) {
  try { execFileSync('sh', ['-c', 'command -v gnuplot'], { stdio: 'ignore' }); } catch { throw new Error('--plot needs gnuplot: run npm run setup (package gnuplot-nox)'); }
}

// Imported after the checks so a missing build fails with the message above.
const bpf = await import(path.join(root, 'dist/native/addon.js'));
const { loadDatapath, setSplice, uninstallDatapath } = await import(path.join(root, 'dist/loader/datapath.js'));
const { pinLayout } = await import(path.join(root, 'dist/loader/manifest.js'));
const { MAP, mcTuple } = await import(path.join(root, 'dist/maps/layout.js'));
const { EbpfBackend } = await import(path.join(root, 'dist/pod-datapath/ebpf.js'));
const { applyCapture } = await import(path.join(root, 'dist/fallback-iptables/apply.js'));
const { podToCaptureConfig } = await import(path.join(root, 'dist/redirect/pod.js'));

/** The C helpers, compiled here when missing or older than their source (they are bench tools, not shipped). */
function buildTools() {
  mkdirSync(BIN, { recursive: true });
  for (const t of ['mc-bench-echo', 'mc-bench-load']) {
    const src = path.join(SRC, `${t}.c`);
    const out = path.join(BIN, t);
    if (existsSync(out) && statSync(out).mtimeMs >= statSync(src).mtimeMs) continue;
    execFileSync('cc', ['-O2', '-Wall', '-Wextra', '-o', out, src], { stdio: 'inherit' });
    log.info({ event: 'compiled', tool: out });
  }
}

// ---------------------------------------------------------------- lab (everything here is undone by cleanup())

const id = `${process.pid}`;
const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-bench-dp-'));
const pinRoot = `/sys/fs/bpf/meshcap-bench-${id}`;
const namespaces = [];
const children = [];
let pods; // EbpfBackend
let datapathLoaded = false;
let cleaned = false;

function cleanup() {
  if (cleaned) return;
  cleaned = true;
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  for (const ns of namespaces.splice(0)) {
    try { execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' }); } catch { /* already gone */ }
  }
  try { pods?.close(); } catch { /* closed */ }
  if (datapathLoaded || existsSync(pinRoot)) {
    const r = uninstallDatapath(pinRoot);
    if (r.leftBehind.length) log.error({ event: 'pins-left', leftBehind: r.leftBehind }, `could not remove: ${r.leftBehind.join(', ')}`);
  }
  rmSync(tmp, { recursive: true, force: true });
}
process.once('exit', cleanup);
for (const [sig, code] of [['SIGINT', 130], ['SIGTERM', 143], ['SIGHUP', 129]]) {
  process.once(sig, () => { log.warn({ event: 'interrupted', signal: sig }); cleanup(); process.exit(code); });
}

async function netns(short) {
  const name = `mcb-${short}-${id}`;
  await run('ip', ['netns', 'add', name]);
  namespaces.push(name);
  await run('ip', ['-n', name, 'link', 'set', 'lo', 'up']);
  return { name, path: `/var/run/netns/${name}` };
}

/** A process in a netns, pinned to one CPU, optionally as the proxy uid; resolves once a stdout line matches `ready`. */
function start(ns, cpu, cmd, { uid, ready } = {}) {
  const priv = uid === undefined ? [] : ['setpriv', `--reuid=${uid}`, `--regid=${uid}`, '--clear-groups'];
  const p = spawn('ip', ['netns', 'exec', ns, 'taskset', '-c', String(cpu), ...priv, ...cmd], { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(p);
  let stderr = '';
  p.stderr.on('data', (d) => { stderr += d; });
  const lines = [];
  const listeners = new Set();
  readline.createInterface({ input: p.stdout }).on('line', (l) => {
    lines.push(l);
    for (const f of listeners) f(l);
  });
  const waitLine = (re, ms = 5000) => new Promise((res, rej) => {
    const done = () => { clearTimeout(t); listeners.delete(f); p.off('exit', onExit); };
    const t = setTimeout(() => { done(); rej(new Error(`${cmd[0]} in ${ns}: no line matching ${re} within ${ms} ms; stderr: ${stderr.trim() || '(empty)'}`)); }, ms);
    const f = (l) => { if (re.test(l)) { done(); res(l); } };
    const onExit = (code, sig) => { done(); rej(new Error(`${cmd[0]} in ${ns} exited (${code ?? sig}): ${stderr.trim() || '(no stderr)'}`)); };
    listeners.add(f);
    p.once('exit', onExit);
  });
  const ok = ready ? waitLine(ready) : Promise.resolve('');
  return { p, lines, waitLine, ok, stderr: () => stderr };
}

/** Wait until something accepts TCP on host:port inside the netns (HAProxy prints nothing when ready). */
async function waitListening(ns, port) {
  for (let i = 0; i < 100; i++) {
    const { stdout } = await run('ip', ['netns', 'exec', ns, 'ss', '-Htln', `sport = :${port}`]);
    if (stdout.trim()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`nothing listens on port ${port} in ${ns} after 5 s`);
}

function istioPodConfig(ip) {
  const pod = {
    apiVersion: 'v1', kind: 'Pod',
    metadata: { name: 'bench', namespace: 'bench', annotations: { 'sidecar.istio.io/status': '{"containers":["istio-proxy"]}' } },
    spec: { containers: [{ name: 'app', image: 'app' }, { name: 'istio-proxy', image: 'proxyv2' }] },
    status: { podIPs: [{ ip }] },
  };
  return podToCaptureConfig(pod, 'istio', { enableIPv6: false });
}

function haproxyConfig(k, server) {
  const sock = path.join(tmp, 'run', `haproxy-${k}.sock`);
  const file = path.join(tmp, `haproxy-${k}.cfg`);
  writeFileSync(file, [
    'global', '  nbthread 1', '  maxconn 4096', `  stats socket ${sock} mode 600 level user`,
    'defaults', '  mode tcp', '  timeout connect 5s', '  timeout client 30s', '  timeout server 30s',
    // server 0.0.0.0:0 = connect to the accepted connection's SO_ORIGINAL_DST (the mesh modes);
    // a fixed server for "direct", where the app addresses the proxy itself.
    'listen outbound', '  bind 0.0.0.0:15001', `  server upstream ${server}`, '',
  ].join('\n'));
  return { file, sock };
}

/** HAProxy's cumulative session count on the outbound frontend, from its stats socket. */
function haproxySessions(sock) {
  return new Promise((res, rej) => {
    let out = '';
    const c = net.connect({ path: sock }, () => c.end('show stat\n'));
    c.on('data', (d) => { out += d; });
    c.on('error', rej);
    c.on('close', () => {
      const [hdr, ...rows] = out.split('\n');
      const cols = hdr.replace(/^# /, '').split(',');
      const fe = rows.map((r) => r.split(',')).find((r) => r[0] === 'outbound' && r[1] === 'FRONTEND');
      if (!fe) return rej(new Error(`no outbound FRONTEND row in HAProxy stats from ${sock}: ${out.slice(0, 200)}`));
      res(Number(fe[cols.indexOf('stot')]));
    });
  });
}

// ---------------------------------------------------------------- measuring

/** One mc-bench-load run inside the pod netns, on the app CPU. */
async function load(ns, host, port, testName, seconds = SECONDS, warmup = WARMUP) {
  const t = TESTS[testName];
  const args = ['netns', 'exec', ns, 'taskset', '-c', APP_CPU, path.join(BIN, 'mc-bench-load'),
    '--test', t.test, '--size', String(t.size), '--host', host, '--port', String(port), '--seconds', String(seconds), '--warmup', String(warmup)];
  try {
    const { stdout } = await run('ip', args, { timeout: (seconds + warmup) * 1000 + 15000 });
    return JSON.parse(stdout);
  } catch (e) {
    throw new Error(`mc-bench-load ${testName} in ${ns} against ${host}:${port} failed: ${(e.stderr || e.message).trim()}`);
  }
}

/** The sockets of a netns that sit in mc_splice right now (the splice's own evidence that it engaged). */
function splicedSockets(cookie) {
  const fd = bpf.objGet(path.join(pinLayout(pinRoot).maps, MAP.splice));
  try {
    return bpf.mapKeys(fd, mcTuple.size).filter((k) => k.readBigUInt64LE(0) === cookie).length;
  } finally {
    bpf.closeFd(fd);
  }
}

/** Tcp OutSegs of a netns (/proc/net/snmp is per netns). */
function tcpOutSegs(ns) {
  const lines = execFileSync('ip', ['netns', 'exec', ns, 'cat', '/proc/net/snmp'], { encoding: 'utf8' }).split('\n').filter((l) => l.startsWith('Tcp:'));
  const [names, values] = lines.map((l) => l.split(/\s+/));
  return Number(values[names.indexOf('OutSegs')]);
}

// ---------------------------------------------------------------- --profile: where the CPU time goes

// Kernel symbols by subsystem. conntrack/NAT/nftables is what iptables mode adds per packet; the
// BPF programs and the sockmap/sk_msg machinery is what eBPF mode adds.
// (Not ct_*: that prefix is the kernel's context tracking, not conntrack.)
const NETFILTER = /^(nf_|nft_|__nf|__nft|ipv4_conntrack|ipv4_confirm|iptable_|ipt_|xt_|hash_conntrack|resolve_normal_ct|init_conntrack|tcp_in_window|get_l4proto)|conntrack|_nat_/;
const BPF = /^(bpf_|__bpf|__cgroup_bpf|cgroup_bpf|sk_psock|sk_msg|__sk_msg|sock_map|sock_hash|tcp_bpf|htab_|__htab|pcpu_freelist|trie_|sk_storage|array_map)|bpf_prog|sockmap|_bpf_|bpf_lru|local_storage/;

/**
 * One run of `test` per cell with perf sampling the CPU the app runs on
 * (cpu-clock, so it works in a VM without PMU access). With the default
 * placement (app, proxy, server on one CPU) every cycle of the path lands in
 * the profile, softirqs included, so samples per operation are CPU time per
 * operation, split by process and kernel subsystem.
 */
async function profileCell(cell, testName) {
  const HZ = 4999;
  const secs = Math.max(SECONDS, 1);
  const out = path.join(tmp, `perf-${cell.leg}-${cell.mode}.data`);
  const rec = spawn('perf', ['record', '-q', '-e', 'cpu-clock', '-F', String(HZ), '-C', APP_CPU, '-o', out, '--', 'sleep', String(secs + 0.3)], { stdio: ['ignore', 'ignore', 'pipe'] });
  children.push(rec);
  let recErr = '';
  rec.stderr.on('data', (d) => { recErr += d; });
  const recDone = new Promise((res) => rec.once('exit', res));
  await new Promise((res) => setTimeout(res, 150));
  const r = await load(cell.pod.ns, cell.target.host, cell.target.port, testName, secs, 0);
  const code = await recDone;
  if (code !== 0) throw new Error(`perf record failed (${code}): ${recErr.trim()}`);
  const { stdout } = await run('perf', ['script', '-i', out, '-F', 'comm,ip,sym,dso'], { maxBuffer: 256 * 2 ** 20 });
  const role = (comm) => (comm === 'mc-bench-load' ? 'app' : comm === 'haproxy' ? 'proxy' : comm === 'mc-bench-echo' ? (cell.leg === 'echo' ? 'proxy' : 'server') : null);
  const agg = { samples: 0, idle: 0, other: 0, user: { app: 0, proxy: 0, server: 0 }, kernel: { netfilter: 0, bpf: 0, rest: 0 } };
  const syms = new Map();
  for (const line of stdout.split('\n')) {
    const m = /^\s*(.+?)\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$/.exec(line);
    if (!m) continue;
    const [, comm, , sym, dso] = m;
    agg.samples++;
    if (comm === 'swapper' || comm.startsWith('swapper/')) { agg.idle++; continue; }
    const who = role(comm);
    if (!who) { agg.other++; continue; }
    const kernel = dso.includes('kernel.kallsyms') || dso.includes('bpf') || sym.startsWith('bpf_prog_');
    if (!kernel) { agg.user[who]++; continue; }
    const cat = NETFILTER.test(sym) ? 'netfilter' : BPF.test(sym) ? 'bpf' : 'rest';
    agg.kernel[cat]++;
    syms.set(sym, (syms.get(sym) ?? 0) + 1);
  }
  // µs of CPU per operation (stream: per 64 KiB echoed)
  const us = (n) => Number(((n / HZ / r.ops) * 1e6).toFixed(2));
  const busy = agg.samples - agg.idle - agg.other;
  return {
    leg: cell.leg, mode: cell.mode, test: testName, ops: r.ops, opsPerSec: r.opsPerSec, samples: agg.samples, otherProcessSamples: agg.other,
    cpuUsPerOp: us(busy),
    userUsPerOp: { app: us(agg.user.app), proxy: us(agg.user.proxy), server: us(agg.user.server) },
    kernelUsPerOp: { netfilter: us(agg.kernel.netfilter), bpf: us(agg.kernel.bpf), rest: us(agg.kernel.rest) },
    topKernel: [...syms].sort((a, b) => b[1] - a[1]).slice(0, 12).map(([sym, n]) => ({ sym, usPerOp: us(n) })),
    topNetfilter: [...syms].filter(([sym]) => NETFILTER.test(sym)).sort((a, b) => b[1] - a[1]).slice(0, 6).map(([sym, n]) => ({ sym, usPerOp: us(n) })),
    topBpf: [...syms].filter(([sym]) => !NETFILTER.test(sym) && BPF.test(sym)).sort((a, b) => b[1] - a[1]).slice(0, 6).map(([sym, n]) => ({ sym, usPerOp: us(n) })),
  };
}

function profileTable(profile, testName) {
  const lines = ['', `== where the CPU time goes: ${TESTS[testName].label}, µs of CPU per operation (perf cpu-clock samples on the app CPU)`];
  lines.push(`${'leg/mode'.padEnd(18)} ${'ops/s'.padStart(8)} ${'total'.padStart(7)} ${'app'.padStart(6)} ${'proxy'.padStart(6)} ${'server'.padStart(6)} ${'netfilt'.padStart(7)} ${'bpf'.padStart(6)} ${'kernel'.padStart(7)}  (user: app/proxy/server; kernel: netfilter/bpf/rest)`);
  for (const p of profile) {
    lines.push([
      `${p.leg}/${p.mode}`.padEnd(18), Math.round(p.opsPerSec).toLocaleString('en-US').padStart(8), p.cpuUsPerOp.toFixed(2).padStart(7),
      p.userUsPerOp.app.toFixed(2).padStart(6), p.userUsPerOp.proxy.toFixed(2).padStart(6), p.userUsPerOp.server.toFixed(2).padStart(6),
      p.kernelUsPerOp.netfilter.toFixed(2).padStart(7), p.kernelUsPerOp.bpf.toFixed(2).padStart(6), p.kernelUsPerOp.rest.toFixed(2).padStart(7),
    ].join(' ') + (p.otherProcessSamples > p.samples * 0.05 ? `  (${Math.round((p.otherProcessSamples / p.samples) * 100)}% of samples from other processes)` : ''));
  }
  return lines.join('\n');
}

function machine() {
  const sh = (c, a) => { try { return execFileSync(c, a, { encoding: 'utf8' }).trim(); } catch { return '?'; } };
  return {
    cpu: os.cpus()[0]?.model.trim() ?? '?', cpus: ncpu, kernel: os.release(), node: process.version,
    haproxy: sh('haproxy', ['-v']).split('\n')[0].replace(/ - https?:.*$/, ''),
    iptables: sh('iptables', ['--version']),
    virtualization: sh('systemd-detect-virt', []),
    memGiB: Math.round(os.totalmem() / 2 ** 30),
  };
}

/** BPF programs attached at the cgroup v2 root right now (ours are not loaded yet when this is asked). */
function cgroupRootPrograms() {
  try {
    const cg = execFileSync('findmnt', ['-n', '-t', 'cgroup2', '-o', 'TARGET'], { encoding: 'utf8' }).trim().split('\n')[0];
    const out = execFileSync('bpftool', ['-j', 'cgroup', 'show', cg], { encoding: 'utf8' });
    return JSON.parse(out || '[]').length;
  } catch {
    return null;
  }
}

const otherTests = () => { try { return execFileSync('pgrep', ['-f', 'vitest'], { encoding: 'utf8' }).trim().split('\n').filter(Boolean).length; } catch { return 0; } };

async function main() {
  buildTools();
  const startedAt = new Date().toISOString();
  const busy = otherTests();
  if (busy) log.warn({ event: 'busy', vitestProcesses: busy }, 'vitest is running on this machine: numbers will be disturbed');

  // One server netns (the remote service), one pod netns per leg and datapath.
  const srv = await netns('srv');
  const server = start(srv.name, SERVER_CPU, [path.join(BIN, 'mc-bench-echo'), '--listen', '0.0.0.0:8080'], { ready: /"event":"ready"/ });
  await server.ok;
  mkdirSync(path.join(tmp, 'run'));
  chownSync(path.join(tmp, 'run'), PROXY_UID, PROXY_UID);
  chmodSync(tmp, 0o755);

  // Programs already at the cgroup root (someone else's datapath) run for every socket of every mode.
  const foreign = cgroupRootPrograms();
  if (foreign) log.warn({ event: 'foreign-programs', count: foreign }, 'other BPF programs are attached at the cgroup v2 root: every mode pays for them');
  // Loaded only when an eBPF mode is measured: the programs sit at the cgroup root and run for the other modes' sockets too.
  if (modes.some((m) => m.startsWith('ebpf'))) {
    await loadDatapath({ pinRoot, splice: false });
    datapathLoaded = true;
    pods = new EbpfBackend(pinRoot);
  }

  const kinds = [...new Set(modes.map((m) => (m === 'noproxy' || m === 'direct' ? 'plain' : m === 'iptables' ? 'iptables' : 'ebpf')))];
  const pod = {}; // `${leg}/${kind}` -> { ns, k, svc, proxy, cookie }
  let k = 0;
  for (const leg of legs) {
    for (const kind of kinds) {
      if (leg === 'echo' && kind === 'plain' && !modes.includes('direct')) continue;
      k++;
      const ns = await netns(`${leg}-${kind}`);
      const [pIf, sIf] = [`mcb${id}${k}p`, `mcb${id}${k}s`];
      await run('ip', ['link', 'add', pIf, 'netns', ns.name, 'type', 'veth', 'peer', 'name', sIf, 'netns', srv.name]);
      await run('ip', ['-n', ns.name, 'addr', 'add', `198.18.${k}.2/24`, 'dev', pIf]);
      await run('ip', ['-n', srv.name, 'addr', 'add', `198.18.${k}.1/24`, 'dev', sIf]);
      await run('ip', ['-n', ns.name, 'link', 'set', pIf, 'up']);
      await run('ip', ['-n', srv.name, 'link', 'set', sIf, 'up']);
      // Same in every pod: ports enough for the crr rounds (TIME_WAIT sockets of earlier rounds may be reused).
      await run('ip', ['netns', 'exec', ns.name, 'sysctl', '-q', '-w', 'net.ipv4.ip_local_port_range=1024 65535', 'net.ipv4.tcp_tw_reuse=1']);

      // The echo leg's service port has no listener in the server netns: a connection that bypassed the proxy fails loudly.
      const svc = { host: `198.18.${k}.1`, port: leg === 'echo' ? 9 : 8080 };
      let proxy;
      if (leg === 'echo') {
        proxy = start(ns.name, PROXY_CPU, [path.join(BIN, 'mc-bench-echo'), '--listen', '0.0.0.0:15001', '--origdst'], { uid: PROXY_UID, ready: /"event":"ready"/ });
        await proxy.ok;
      } else {
        const h = haproxyConfig(k, kind === 'plain' ? `${svc.host}:${svc.port}` : '0.0.0.0:0');
        proxy = start(ns.name, PROXY_CPU, ['haproxy', '-db', '-f', h.file], { uid: PROXY_UID });
        proxy.sock = h.sock;
        await waitListening(ns.name, 15001);
      }

      let cookie = null;
      if (kind === 'iptables') await applyCapture(ns.path, istioPodConfig(`198.18.${k}.2`), { lockDir: path.join(tmp, 'xtables'), logger: log });
      if (kind === 'ebpf') cookie = await pods.register({ netns: ns.path, config: istioPodConfig(`198.18.${k}.2`), podIPs: [`198.18.${k}.2`] });
      pod[`${leg}/${kind}`] = { ns: ns.name, k, svc, proxy, cookie };
      log.info({ event: 'pod', leg, kind, netns: ns.name, service: `${svc.host}:${svc.port}` });
    }
  }

  const cells = [];
  for (const leg of legs) {
    for (const mode of modes) {
      if (mode === 'noproxy' && leg === 'echo') continue; // on the echo leg the proxy is the service
      const kind = mode === 'noproxy' || mode === 'direct' ? 'plain' : mode === 'iptables' ? 'iptables' : 'ebpf';
      const p = pod[`${leg}/${kind}`];
      const target = mode === 'direct' ? { host: '127.0.0.1', port: 15001 } : p.svc;
      cells.push({ leg, mode, kind, pod: p, target });
    }
  }

  const proxyCount = async (cell) => {
    if (cell.leg === 'full') return { accepted: await haproxySessions(cell.pod.proxy.sock), origdst: null };
    cell.pod.proxy.p.kill('SIGUSR1');
    const l = JSON.parse(await cell.pod.proxy.waitLine(/"event":"stats"/));
    return { accepted: l.accepted, origdst: l.origdst_ok };
  };

  // Check every cell carries traffic the way its name says before timing anything.
  for (const cell of cells) {
    if (cell.kind === 'ebpf') setSplice(pinRoot, cell.mode === 'ebpf-splice');
    const before = await proxyCount(cell);
    const r = await load(cell.pod.ns, cell.target.host, cell.target.port, 'crr', 0.05, 0);
    const after = await proxyCount(cell);
    const through = after.accepted - before.accepted;
    const want = cell.mode === 'noproxy' ? 0 : r.connects;
    if (through !== want) throw new Error(`${cell.leg}/${cell.mode}: ${r.connects} connects, the proxy accepted ${through} (expected ${want}): the traffic does not take the path this mode names`);
    if (cell.leg === 'echo' && cell.mode !== 'direct' && after.origdst - before.origdst !== r.connects) {
      throw new Error(`${cell.leg}/${cell.mode}: SO_ORIGINAL_DST answered ${after.origdst - before.origdst} of ${r.connects} accepted connections`);
    }
    // TCP segments per request/response in the pod netns: 2 per hop that goes through the TCP/IP stack.
    const segs0 = tcpOutSegs(cell.pod.ns);
    const probe = load(cell.pod.ns, cell.target.host, cell.target.port, 'rr1', 0.3, 0);
    let spliced = null;
    if (cell.kind === 'ebpf') {
      await new Promise((res) => setTimeout(res, 150));
      spliced = splicedSockets(cell.pod.cookie);
    }
    const pr = await probe;
    cell.segsPerOp = (tcpOutSegs(cell.pod.ns) - segs0) / pr.ops;
    cell.spliced = spliced;
    const want2 = cell.mode === 'ebpf-splice' ? 2 : 0;
    if (spliced !== null && spliced !== want2) throw new Error(`${cell.leg}/${cell.mode}: ${spliced} sockets of the pod in mc_splice during a connection, expected ${want2}`);
    log.info({ event: 'verified', leg: cell.leg, mode: cell.mode, connects: r.connects, proxied: through, segsPerOp: Number(cell.segsPerOp.toFixed(2)), splicedSockets: spliced });
  }
  // The splice engaged if the app<->proxy hop's two segments per exchange left the TCP stack.
  const splice = {};
  for (const leg of legs) {
    const on = cells.find((c) => c.leg === leg && c.mode === 'ebpf-splice');
    const off = cells.find((c) => c.leg === leg && c.mode === 'ebpf');
    if (!on || !off) continue;
    splice[leg] = { engaged: on.segsPerOp <= off.segsPerOp - 1.5, segsPerOpOn: on.segsPerOp, segsPerOpOff: off.segsPerOp };
    if (!splice[leg].engaged) {
      log.warn({ event: 'splice-not-engaged', leg, ...splice[leg] }, 'splice on: the sockets are in mc_splice but every byte still goes through TCP (no sk_msg verdict program attached to mc_splice?)');
    }
  }

  const results = [];
  const t0 = Date.now();
  const progress = createStepProgress({ name: 'bench:datapath', total: ROUNDS * tests.length * cells.length + (opt.profile ? cells.length : 0) });
  for (let round = 0; round < ROUNDS; round++) {
    for (const testName of tests) {
      for (const leg of legs) {
        const legCells = cells.filter((c) => c.leg === leg);
        // Rotate the order every round: no mode is always first after a test switch.
        const order = legCells.map((_, i) => legCells[(i + round) % legCells.length]);
        for (const cell of order) {
          progress.step(`round ${round + 1}/${ROUNDS} ${testName} ${leg} leg, ${cell.mode}`);
          if (cell.kind === 'ebpf') setSplice(pinRoot, cell.mode === 'ebpf-splice');
          const r = await load(cell.pod.ns, cell.target.host, cell.target.port, testName);
          results.push({ round, leg, mode: cell.mode, testName, ...r });
        }
      }
    }
    log.info({ event: 'round', round: round + 1, of: ROUNDS, elapsedS: Math.round((Date.now() - t0) / 1000) });
  }
  if (datapathLoaded) setSplice(pinRoot, false);

  let profile = null;
  if (opt.profile) {
    profile = [];
    for (const cell of cells) {
      progress.step(`profile ${opt.profile} ${cell.leg} leg, ${cell.mode}`);
      if (cell.kind === 'ebpf') setSplice(pinRoot, cell.mode === 'ebpf-splice');
      profile.push(await profileCell(cell, opt.profile));
    }
    if (datapathLoaded) setSplice(pinRoot, false);
  }
  progress.done();

  const summary = summarize(results);
  const data = {
    startedAt, finishedAt: new Date().toISOString(), durationS: Math.round((Date.now() - t0) / 1000),
    machine: machine(),
    options: { rounds: ROUNDS, seconds: SECONDS, warmup: WARMUP, tests, legs, modes, cpus: { app: APP_CPU, proxy: PROXY_CPU, server: SERVER_CPU } },
    otherTests: { atStart: busy, atEnd: otherTests() },
    foreignCgroupPrograms: foreign,
    splice,
    paths: cells.map((c) => ({ leg: c.leg, mode: c.mode, target: `${c.target.host}:${c.target.port}`, tcpSegsPerExchange: c.segsPerOp, splicedSockets: c.spliced })),
    summary, results, profile,
  };
  console.log(table(summary, legs, tests, modes));
  for (const [leg, sp] of Object.entries(splice)) {
    console.log(`\nsplice on the ${leg} leg: ${sp.engaged ? 'engaged' : 'NOT engaged'} (TCP segments per 1 B exchange in the pod: ${sp.segsPerOpOn.toFixed(2)} with it on, ${sp.segsPerOpOff.toFixed(2)} off)${sp.engaged ? '' : ': ebpf-splice does not measure a working splice'}`);
  }
  if (profile) console.log(profileTable(profile, opt.profile));
  if (data.otherTests.atStart || data.otherTests.atEnd) console.log('\nwarning: vitest was running on this machine during the run; rerun on a quiet machine for numbers to quote');
  const jsonFile = opt.json ?? path.join(BIN, `datapath-${startedAt.replace(/[:.]/g, '-')}.json`);
  writeFileSync(jsonFile, JSON.stringify(data, null, 1) + '\n');
  log.info({ event: 'written', json: jsonFile });
  if (opt.plot) {
    plot(data, opt.plot);
    log.info({ event: 'written', plot: opt.plot });
  }
}

try {
  await main();
} catch (e) {
  log.error({ event: 'failed', err: e.message });
  console.error(`bench-datapath: ${e.message}`);
  process.exitCode = 1;
} finally {
  cleanup();
}
