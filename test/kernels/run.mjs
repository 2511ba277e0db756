#!/usr/bin/env node
// @ts-check
// npm run test:kernels — boot every kernel of the matrix (lib/matrix.mjs) in
// qemu and run meshcap's checks inside it: the guest smoke check, `meshcap
// probe --json` against the expected mode, and the privileged vitest suite
// told which mode the kernel should get (MESHCAP_EXPECT_MODE) and how much
// slower the guest is (MESHCAP_TEST_TIME_SCALE). On a `forceIptables` kernel
// the suite runs with MESHCAP_MODE=ebpf, then the mode-parametrised tests with
// MESHCAP_MODE=iptables. One line per kernel; exit 1 if any kernel failed.
// Installs the Debian packages it needs (qemu, static busybox, cpio) first.
// See docs/kernels.md.
//
//   node test/kernels/run.mjs [--kernels 5.10,6.1] [--smoke] [--verifier-demo]
//                             [--accel auto|tcg|kvm] [--tcg-thread multi|single] [--time-scale N] [--timeout SEC] [--refresh] [--verbose]
//                             [--vitest-args "test/privileged/x.test.ts -t name"]
import { execa } from 'execa';
import { randomBytes } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseOptions } from '../../scripts/lib/cli-options.mjs';
import { fetchKernel } from './lib/fetch-kernel.mjs';
import { buildInitramfs } from './lib/initramfs.mjs';
import { ConsoleReader, renderRunScript } from './lib/job.mjs';
import { selectKernels } from './lib/matrix.mjs';
import { bootVm, kvmWorks } from './lib/qemu.mjs';
import { createProgress } from './lib/progress.mjs';
import { clip, failedTests, failureLines, parseProbeMode, parseVitestSummary, verifierLines } from './lib/report.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..');
const cacheRoot = path.join(repo, 'build', 'kernels');
// Readable progress on stderr (lib/progress.mjs): a live status line on a
// TTY, plain timestamped lines otherwise; the summary goes to stdout.
let progress = createProgress({ write: (s) => process.stderr.write(s), tty: process.stderr.isTTY === true, kernels: 1 });
const log = {
  /** @param {Record<string, unknown>} d @param {string} msg */
  info: (d, msg) => progress.log(msg, d),
  /** @param {Record<string, unknown>} d @param {string} msg */
  warn: (d, msg) => progress.log(`warning: ${msg}`, d),
};

// Modules loaded in the guest before the job; the kernel autoloads the rest.
// No legacy iptable_* modules: their tables make iptables-nft print warnings.
const PRELOAD = 'veth overlay nf_tables nft_compat nft_chain_nat nf_nat nf_conntrack xt_REDIRECT xt_owner ' +
  'xt_mark xt_conntrack xt_tcpudp xt_multiport xt_comment sch_ingress cls_bpf dummy';

const opt = parseOptions(import.meta.url, 'test:kernels', {
  kernels: { type: 'string' },
  smoke: { type: 'boolean', default: false },
  'verifier-demo': { type: 'boolean', default: false },
  accel: { type: 'string', default: process.env.MESHCAP_VM_ACCEL ?? 'auto' },
  // qemu's TCG threading. multi: a host thread per vCPU (faster). single:
  // both vCPUs on one host thread, for a guest that crashes with an
  // unrecognised "Oops: int3" at a static-branch site, which is one vCPU
  // running code another has just rewritten (docs/kernels.md).
  'tcg-thread': { type: 'string', default: process.env.MESHCAP_VM_TCG_THREAD ?? 'multi' },
  timeout: { type: 'string', default: '3600' },
  // How many times slower than the host the guest is; stretches test deadlines (MESHCAP_TEST_TIME_SCALE).
  'time-scale': { type: 'string' },
  refresh: { type: 'boolean', default: false },
  verbose: { type: 'boolean', default: false },
  // Extra vitest arguments (shell words), e.g. a file and -t 'name', to chase one failure on one kernel.
  'vitest-args': { type: 'string', default: '' },
});
if (!['auto', 'tcg', 'kvm'].includes(String(opt.accel))) throw new Error(`--accel must be auto, tcg or kvm, not '${opt.accel}'`);
if (!['multi', 'single'].includes(String(opt['tcg-thread']))) throw new Error(`--tcg-thread must be multi or single, not '${opt['tcg-thread']}'`);
const vmTimeoutSec = Number(opt.timeout);
if (!(vmTimeoutSec > 0)) throw new Error(`--timeout must be a positive number of seconds, not '${opt.timeout}'`);
if (opt['time-scale'] !== undefined && !(Number(opt['time-scale']) >= 1)) {
  throw new Error(`--time-scale must be a number >= 1, not '${opt['time-scale']}'`);
}
/** How many times the guest's deadlines are stretched under TCG, measured in docs/kernels.md. */
const TCG_TIME_SCALE = 10;
/** Set once the accelerator is known (main). */
let timeScale = 1;

// Scratch dirs (initramfs) of VMs in flight, removed also on Ctrl-C/SIGTERM;
// qemu itself dies with us (execa kills children when the parent exits).
const workDirs = new Set();
/** @param {string} prefix */
function tempWorkDir(prefix) {
  const d = mkdtempSync(path.join(tmpdir(), prefix));
  workDirs.add(d);
  return d;
}
for (const sig of /** @type {const} */ (['SIGINT', 'SIGTERM'])) {
  process.once(sig, () => {
    for (const d of workDirs) rmSync(d, { recursive: true, force: true });
    log.warn({ signal: sig }, 'interrupted: VMs stopped, scratch removed');
    process.exit(130);
  });
}

/**
 * The steps one VM runs. The privileged suite is whatever vitest finds, so
 * new tests need no change here.
 * @param {import('./lib/matrix.mjs').KernelSpec} spec
 * @param {import('./lib/fetch-kernel.mjs').FetchedKernel} kernel
 * @returns {import('./lib/job.mjs').Step[]}
 */
function stepsFor(spec, kernel) {
  /** @type {import('./lib/job.mjs').Step[]} */
  const steps = [{
    name: 'smoke', command: 'sh test/kernels/guest/smoke.sh', env: { EXPECT_RELEASE: kernel.release }, timeoutSec: 300,
  }];
  if (opt['verifier-demo']) {
    const pin = '/sys/fs/bpf/meshcap-verifier-demo';
    steps.push({
      name: 'verifier-demo', timeoutSec: 300,
      command: `bpftool prog load ${path.relative(repo, fixtureObject())} ${pin} && bpftool prog show pinned ${pin}; rc=$?; rm -f ${pin}; exit $rc`,
    });
  }
  if (opt.smoke) return steps;
  steps.push({
    name: 'probe', timeoutSec: 300,
    command: 'test -e bin/meshcap || { echo "bin/meshcap is missing: build the project (npm run build)"; exit 2; }; node bin/meshcap probe --json',
  });
  // The root config's 120 s test/hook timeouts, stretched like every other deadline.
  const limit = Math.ceil(120_000 * timeScale);
  // test/privileged only: the privileged project also holds this runner's own
  // VM test (test/kernels/e2e), which must not boot VMs inside the VM. The
  // container images test (test/privileged/images) is left out too: it builds
  // the images of the current commit with podman and runs them, which says
  // nothing about the kernel's hooks; npm test runs it on the host.
  const vitest = (/** @type {string} */ files) =>
    `npx --no-install vitest run --project privileged --testTimeout=${limit} --hookTimeout=${limit} --exclude 'test/privileged/images/**' ` +
    // guest/failed-now.mjs: each failure's error as it happens, not only in the
    // end-of-run summary that a run cut by the VM limit never prints
    `--reporter=default --reporter=./test/kernels/guest/failed-now.mjs ${files || 'test/privileged'}`;
  // MESHCAP_EXPECT_MODE: where the matrix expects iptables, the eBPF blocks of
  // the mode-parametrised tests assert the probe's refusal instead of running
  // (test/helpers/datapaths.ts).
  const env = { MESHCAP_EXPECT_MODE: spec.expectedMode, MESHCAP_TEST_TIME_SCALE: String(timeScale) };
  if (spec.forceIptables && spec.expectedMode !== 'ebpf') {
    throw new Error(`matrix entry ${spec.id}: forceIptables only means something where the probe picks eBPF`);
  }
  if (!spec.forceIptables) {
    steps.push({ name: 'privileged', command: vitest(opt['vitest-args']), env, timeoutSec: vmTimeoutSec });
    return steps;
  }
  // A kernel whose probe picks eBPF, run twice without overlap: the whole suite
  // with eBPF forced, then the mode-parametrised tests with iptables forced.
  steps.push({ name: 'privileged', command: vitest(opt['vitest-args']), env: { ...env, MESHCAP_MODE: 'ebpf' }, timeoutSec: vmTimeoutSec });
  const forced = opt['vitest-args'] ? modeArgs(opt['vitest-args']) : modeTestFiles().join(' ');
  if (forced !== null) {
    steps.push({ name: 'privileged-iptables', command: vitest(forced), env: { ...env, MESHCAP_MODE: 'iptables' }, timeoutSec: vmTimeoutSec });
  }
  return steps;
}

/** A privileged test file that runs a datapath per MESHCAP_MODE (test/helpers/datapaths.ts). */
const followsMode = (/** @type {string} */ file) => /\b(describeModes|requestedModes)\(/.test(readFileSync(file, 'utf8'));

/**
 * --vitest-args for the MESHCAP_MODE=iptables pass: the test files named
 * there that follow MESHCAP_MODE, with the other arguments (-t NAME, ...);
 * an eBPF-only or mode-free file would only run a second time unchanged.
 * null: files were named and none follows the mode (no iptables pass).
 * @param {string} args
 */
function modeArgs(args) {
  const words = args.match(/'[^']*'|"[^"]*"|\S+/g) ?? [];
  const isFile = (/** @type {string} */ w) => /\.test\.ts$/.test(w) && existsSync(path.resolve(repo, w));
  const files = words.filter(isFile);
  if (!files.length) return args;
  const kept = words.filter((w) => !isFile(w) || followsMode(path.resolve(repo, w)));
  return kept.some(isFile) ? kept.join(' ') : null;
}

/**
 * Privileged test files whose datapath modes follow MESHCAP_MODE (they use
 * describeModes or requestedModes from test/helpers/datapaths.ts, e.g. the
 * sandbox's runs), relative to the repository.
 */
function modeTestFiles() {
  const dir = path.join(repo, 'test', 'privileged');
  const files = readdirSync(dir, { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.test.ts') && followsMode(path.join(dir, f)))
    .map((f) => path.join('test', 'privileged', f)).sort();
  if (!files.length) throw new Error('no privileged test uses describeModes()/requestedModes(): nothing would run with MESHCAP_MODE=iptables');
  return files;
}

function fixtureObject() {
  return path.join(cacheRoot, 'fixtures', 'needs-5.11-helper.bpf.o');
}

async function buildFixture() {
  mkdirSync(path.dirname(fixtureObject()), { recursive: true });
  await execa('clang', ['-target', 'bpf', '-O2', '-g', '-I/usr/include/x86_64-linux-gnu', '-c',
    path.join(here, 'fixtures', 'needs-5.11-helper.bpf.c'), '-o', fixtureObject()]);
}

/**
 * @param {import('./lib/job.mjs').StepResult | undefined} s
 * @param {string} label
 * @param {string[]} problems  appended to
 * @param {string[]} details   appended to
 */
function judgeVitest(s, label, problems, details) {
  if (!s) return '-';
  const sum = parseVitestSummary(s.output);
  const counts = !sum ? 'no summary'
    : `${sum.passed} passed, ${sum.failed} failed${sum.skipped ? `, ${sum.skipped} skipped` : ''}${sum.errors ? `, ${sum.errors} unhandled errors` : ''}`;
  // A skipped test proves nothing on this kernel: where eBPF mode cannot run, the
  // tests say so by asserting the probe's refusal (test/helpers/datapaths.ts).
  if (s.rc === 0 && sum?.skipped) problems.push(`${label}: ${sum.skipped} tests skipped (${counts})`);
  if (s.rc !== 0 || !sum) {
    problems.push(`${label}: ${s.rc === null ? 'did not finish' : s.rc === 124 ? 'timed out' : `exit ${s.rc}`} (${counts})`);
    const v = verifierLines(s.output);
    if (v.length) details.push(`${label}: verifier rejected a program:`, ...v.map((l) => `    ${clip(l)}`));
    // Each failed test, then the error vitest printed under its group.
    const failed = failedTests(s.output).flatMap((g) => [...g.tests, ...(g.why ? [`  → ${clip(g.why)}`] : [])]);
    if (failed.length) {
      details.push(`${label}: failed tests:`, ...failed.slice(0, 60).map((l) => `    ${l}`));
    } else if (!v.length) {
      details.push(`${label}:`, ...failureLines(s.output).map((l) => `    ${l}`));
    }
  }
  return counts;
}

/**
 * @param {import('./lib/matrix.mjs').KernelSpec} spec
 * @param {'tcg'|'kvm'} accel
 */
async function runKernel(spec, accel) {
  const t0 = Date.now();
  progress.kernelStart(spec.id);
  const kernel = await fetchKernel(spec, { cacheRoot, refresh: opt.refresh, log: (msg, d) => log.info(d, msg) });
  const nonce = randomBytes(6).toString('hex');
  const steps = stepsFor(spec, kernel);
  const workDir = tempWorkDir(`meshcap-vm-${spec.id}-`);
  const logDir = path.join(cacheRoot, 'logs');
  mkdirSync(logDir, { recursive: true });
  const consoleLog = path.join(logDir, `${spec.id}.console.log`);
  // Written as it arrives, so a long run can be followed with tail -f.
  const transcript = openSync(consoleLog, 'w');
  const reader = new ConsoleReader(nonce);
  let boot;
  try {
    const initrd = await buildInitramfs({
      kernel, workDir,
      env: { NONCE: nonce, RELEASE: kernel.release, MODULES_DIR: kernel.modulesDir, KERNEL_DIR: kernel.dir, PRELOAD_MODULES: PRELOAD, REPO_DIR: repo },
      runScript: renderRunScript({ nonce, repo, steps }),
    });
    log.info({ kernel: spec.id, release: kernel.release, accel, steps: steps.map((s) => s.name), console: consoleLog }, 'booting');
    boot = await bootVm({
      vmlinuz: kernel.vmlinuz, initrd, accel, timeoutSec: vmTimeoutSec, tcgThread: /** @type {'multi'|'single'} */ (opt['tcg-thread']),
      onLine: (l) => {
        writeSync(transcript, l + '\n');
        const before = reader.current;
        reader.push(l);
        if (reader.current !== before) {
          if (before) progress.stepEnd(before.r.name, before.r.rc, before.r.seconds);
          if (reader.current) progress.stepBegin(reader.current.r.name);
        }
        if (opt.verbose) process.stderr.write(`[${spec.id}] ${l}\n`);
      },
    });
    reader.finish();
  } finally {
    rmSync(workDir, { recursive: true, force: true });
    workDirs.delete(workDir);
    closeSync(transcript);
  }

  /** @type {string[]} */ const problems = [];
  /** @type {string[]} */ const details = [];
  if (reader.initFailure) problems.push(`VM init: ${reader.initFailure}`);
  if (!reader.guest) {
    problems.push(boot.timedOut ? `no userspace within ${vmTimeoutSec} s` : `VM stopped before userspace (qemu ${boot.signal ?? `exit ${boot.exitCode}`})`);
    details.push(...reader.other.filter((l) => l.trim()).slice(-15).map((l) => `    ${l}`));
    if (boot.stderr) details.push(`    qemu: ${boot.stderr.split('\n').slice(0, 3).join(' / ')}`);
  } else if (boot.timedOut) {
    const running = reader.steps.find((s) => s.rc === null);
    problems.push(`hard timeout after ${vmTimeoutSec} s${running ? ` in step ${running.name}` : ''}`);
  } else if (reader.rc === null) {
    problems.push(`VM ended without a result (qemu ${boot.signal ?? `exit ${boot.exitCode}`}: kernel panic?)`);
    details.push(...reader.other.filter((l) => /panic|BUG|Oops|Call Trace/i.test(l)).slice(0, 10).map((l) => `    ${l}`));
  }

  for (const s of reader.steps.filter((x) => x.name === 'smoke' || x.name === 'verifier-demo')) {
    if (s.rc === 0) continue;
    problems.push(`${s.name}: ${s.rc === null ? 'did not finish' : `exit ${s.rc}`}`);
    const v = verifierLines(s.output);
    details.push(`${s.name}:`, ...(v.length ? v : failureLines(s.output)).map((l) => `    ${l}`));
  }
  for (const want of steps) {
    if (reader.guest && !reader.step(want.name) && !boot.timedOut && reader.rc !== null) problems.push(`${want.name}: never started`);
  }

  let mode = '-';
  const probe = reader.step('probe');
  if (probe) {
    const p = parseProbeMode(probe.output);
    mode = p?.mode ?? '?';
    if (probe.rc !== 0 || !p) {
      problems.push(`probe: ${probe.rc !== 0 ? `exit ${probe.rc}` : 'no mode in its JSON'}`);
      details.push('probe:', ...failureLines(probe.output).map((l) => `    ${l}`));
    } else if (p.mode !== spec.expectedMode) {
      problems.push(`probe chose ${p.mode}, the matrix expects ${spec.expectedMode} (${spec.why})`);
      details.push(`probe: ${JSON.stringify(p.json).slice(0, 400)}`);
    }
  }
  const tests = judgeVitest(reader.step('privileged'), 'privileged', problems, details);
  const forced = judgeVitest(reader.step('privileged-iptables'), 'privileged MESHCAP_MODE=iptables', problems, details);

  const seconds = (Date.now() - t0) / 1000;
  return {
    spec, kernel, ok: problems.length === 0, mode, tests, forced, seconds, problems, details, consoleLog,
    stepTimes: reader.steps.map((s) => `${s.name} ${s.seconds.toFixed(0)}s`).join(', '),
    bootSeconds: boot.seconds,
  };
}

async function chooseAccel(first) {
  if (opt.accel !== 'auto') return /** @type {'tcg'|'kvm'} */ (opt.accel);
  const kernel = await fetchKernel(first, { cacheRoot, refresh: false, log: (msg, d) => log.info(d, msg) });
  const nonce = randomBytes(6).toString('hex');
  const workDir = tempWorkDir('meshcap-vm-kvmprobe-');
  try {
    const initrd = await buildInitramfs({
      kernel, workDir, env: { NONCE: nonce, KVM_PROBE: '1', RELEASE: kernel.release }, runScript: 'exit 0\n',
    });
    const reader = new ConsoleReader(nonce);
    const r = await kvmWorks({ vmlinuz: kernel.vmlinuz, initrd, isOk: () => reader.kvmOk, onLine: (l) => reader.push(l) });
    log.info({ kvm: r.ok, why: r.why }, r.ok ? 'using KVM' : 'KVM unusable, using TCG software emulation');
    return r.ok ? 'kvm' : 'tcg';
  } finally {
    rmSync(workDir, { recursive: true, force: true });
    workDirs.delete(workDir);
  }
}

/**
 * Debian packages only the matrix needs (package -> why). Installed here, not
 * by scripts/setup.sh, so `npm test` on a fresh machine does not pull qemu.
 */
const VM_PACKAGES = {
  'qemu-system-x86': 'qemu-system-x86_64 boots the kernels',
  'busybox-static': 'the initramfs userland and busybox depmod (must be static)',
  cpio: 'packs the initramfs',
  'xz-utils': 'decompresses .ko.xz modules',
  zstd: 'decompresses .ko.zst modules',
  file: 'checks that /bin/busybox is static',
};

async function preflight() {
  if (process.getuid?.() !== 0) throw new Error('test:kernels must run as root (apt-get, mknod for the initramfs console, qemu)');
  const installed = async (/** @type {string} */ p) =>
    (await execa('dpkg-query', ['-W', '-f=${Status}', p], { reject: false })).stdout.includes('install ok installed');
  const missing = [];
  for (const p of Object.keys(VM_PACKAGES)) if (!(await installed(p))) missing.push(p);
  if (missing.length) {
    log.info({ packages: missing }, 'installing Debian packages the kernel matrix needs');
    const env = { DEBIAN_FRONTEND: 'noninteractive' };
    const up = await execa('apt-get', ['update', '-qq'], { env, reject: false });
    if (up.exitCode !== 0) throw new Error(`apt-get update failed (exit ${up.exitCode}): ${up.stderr.trim()}`);
    const r = await execa('apt-get', ['install', '-y', '-qq', '--no-install-recommends', ...missing], { env, reject: false });
    if (r.exitCode !== 0) throw new Error(`apt-get install ${missing.join(' ')} failed (exit ${r.exitCode}): ${r.stderr.trim()}`);
  }
  if (!existsSync('/bin/busybox') || !(await execa('file', ['-L', '/bin/busybox'], { reject: false })).stdout.includes('statically linked')) {
    throw new Error('/bin/busybox is not the static one: apt-get install busybox-static (it replaces the dynamic busybox package)');
  }
}

async function main() {
  await preflight();
  const specs = selectKernels(opt.kernels?.split(',').map((s) => s.trim()).filter(Boolean));
  if (opt['verifier-demo']) await buildFixture();
  const accel = await chooseAccel(specs[0]);
  // TCG runs the suite's work ~10x slower than this host (docs/kernels.md); KVM ~1.5x.
  timeScale = opt['time-scale'] !== undefined ? Number(opt['time-scale']) : accel === 'tcg' ? TCG_TIME_SCALE : 2;
  progress = createProgress({
    write: (s) => process.stderr.write(s), tty: process.stderr.isTTY === true, kernels: specs.length,
    // docs/kernels.md: about 17 min per kernel under TCG; KVM: learnt from the first kernel
    ...(accel === 'tcg' && !opt.smoke ? { typicalKernelSeconds: 17 * 60 } : {}),
  });
  const ticker = setInterval(() => progress.tick(), 1000);
  ticker.unref();
  const results = [];
  for (const spec of specs) {
    let r;
    try {
      r = await runKernel(spec, accel);
    } catch (e) {
      r = { spec, ok: false, problems: [`setup: ${/** @type {Error} */ (e).message}`], details: [], seconds: 0 };
    }
    results.push(r);
    progress.kernelEnd(r.ok);
    printLine(r, accel);
  }
  clearInterval(ticker);
  progress.stop();
  const failed = results.filter((r) => !r.ok).length;
  console.log(`kernels: ${results.length - failed} passed, ${failed} failed`);
  process.exitCode = failed ? 1 : 0;
}

/** One line per kernel, then why it failed. */
function printLine(r, accel) {
  const rel = r.kernel?.release ?? '?';
  const parts = [
    `kernel ${r.spec.id.padEnd(5)}`, `release ${rel}`,
    `mode ${r.mode ?? '-'} (expected ${r.spec.expectedMode})`,
    `tests ${r.tests ?? '-'}`,
  ];
  if (r.forced && r.forced !== '-') parts.push(`iptables-forced ${r.forced}`);
  parts.push(`${Math.round(r.seconds)} s ${accel}`, r.ok ? 'PASS' : 'FAIL');
  console.log(parts.join(' | '));
  if (r.stepTimes) console.log(`    steps: ${r.stepTimes}`);
  for (const p of r.problems) console.log(`    ✗ ${p}`);
  for (const d of r.details) console.log(`  ${d}`);
  if (!r.ok && r.consoleLog) console.log(`    full console: ${path.relative(process.cwd(), r.consoleLog)}`);
}

main().catch((e) => {
  console.error(`test:kernels: ${e instanceof Error ? e.message : e}`);
  process.exitCode = 1;
});
