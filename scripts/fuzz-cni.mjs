#!/usr/bin/env node
// Coverage-guided fuzzing of the C forwarder's parsing (docs/reliability.md,
// "Hostile input"): builds the libFuzzer harnesses in native/cni/fuzz/ with
// clang -fsanitize=fuzzer,address,undefined into build/fuzz/, seeds each
// corpus from the test data, runs each harness and prints one line per
// harness with its executions, then a JSON summary line. Exit 1 on any crash,
// sanitizer report, leak or failed invariant (the reproducer is kept in
// build/fuzz/artifacts/).
//   node scripts/fuzz-cni.mjs                    20 s per harness (CI: 60 s in all)
//   node scripts/fuzz-cni.mjs --seconds 600
//   node scripts/fuzz-cni.mjs --runs 10000000    a fixed number of executions per harness
//   --out DIR (default build/fuzz), --only fuzz_netconf|fuzz_env|fuzz_reply
import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const src = path.join(root, 'native/cni/src');
const arg0 = (name) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1] : undefined;
};
const out = path.resolve(arg0('--out') ?? path.join(root, 'build/fuzz'));
const HARNESSES = ['fuzz_netconf', 'fuzz_env', 'fuzz_reply'];
// the forwarder's sources minus main.c (main() does I/O; the harnesses call the pure parts)
const SOURCES = ['cni_config.c', 'cni_error.c', 'cni_env.c', 'relay.c', 'result_convert.c'];

const arg = (name) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1] : undefined;
};
const seconds = Number(arg('--seconds') ?? 20);
const runs = arg('--runs') ? Number(arg('--runs')) : undefined;
const only = arg('--only');

function clang() {
  for (const c of ['clang', 'clang-14']) {
    try {
      execFileSync(c, ['--version'], { stdio: 'ignore' });
      return c;
    } catch { /* next */ }
  }
  throw new Error('fuzz-cni: clang is missing (scripts/setup.sh installs it, and libclang-rt-14-dev for libFuzzer)');
}

function build(cc, h) {
  const bin = path.join(out, 'bin', h);
  mkdirSync(path.dirname(bin), { recursive: true });
  try {
    execFileSync(cc, [
      '-g', '-O1', '-fsanitize=fuzzer,address,undefined', '-fno-sanitize-recover=all', '-D_GNU_SOURCE',
      `-I${src}`, path.join(root, 'native/cni/fuzz', `${h}.c`), ...SOURCES.map((f) => path.join(src, f)),
      '-ljansson', '-o', bin,
    ], { stdio: ['ignore', 'inherit', 'pipe'] });
  } catch (e) {
    const err = String(e.stderr ?? e.message);
    if (/libclang_rt\.fuzzer|cannot find -l|fuzzer/.test(err)) throw new Error(`fuzz-cni: clang cannot link libFuzzer: install libclang-rt-14-dev (scripts/setup.sh does)\n${err}`);
    throw new Error(`fuzz-cni: building ${h} failed:\n${err}`);
  }
  return bin;
}

/** Seed corpora from the test data: the conversion vectors as stdin and as agent replies, plus the wire shapes. */
function seed() {
  const { vectors } = JSON.parse(readFileSync(path.join(root, 'test/fixtures/cni/result-conversion.json'), 'utf8'));
  const seeds = { fuzz_netconf: [], fuzz_env: [], fuzz_reply: [] };
  const versions = ['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'];
  for (const [i, x] of vectors.entries()) {
    const v = versions[i % versions.length];
    seeds.fuzz_netconf.push(JSON.stringify({
      cniVersion: v, name: 'meshnet', type: 'meshcap-cni', agentSocket: '/var/run/meshcap/cni.sock', agentTimeoutMs: 10000,
      excludeNamespaces: ['kube-system'], ...(x.prevResult === null ? {} : { prevResult: x.prevResult }),
    }));
    const e = x.expect[v];
    const stdout = 'error' in e ? JSON.stringify({ cniVersion: v, ...e.error }) : JSON.stringify(e);
    seeds.fuzz_reply.push(String.fromCharCode(i % versions.length) + JSON.stringify({ exitCode: 'error' in e ? 1 : 0, stdout, agent: { version: '0.1.0', commit: null } }));
  }
  seeds.fuzz_netconf.push('{"cniVersion":"1.1.0","agentTimeoutMs":0}', '{"agentSocket":"relative"}', '[]', '{"cniVersion":1}');
  seeds.fuzz_reply.push('\x83{"exitCode":0,"stdout":""}', '\x00{"exitCode":126,"stdout":"x"}', '\x04{"exitCode":1,"stdout":"TypeError"}');
  seeds.fuzz_env.push(
    ['ADD', 'c0ffee', '/var/run/netns/pod', 'eth0', '/opt/cni/bin', 'IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web', '{"cniVersion":"1.1.0"}'].join('\0'),
    ['DEL', 'c1', '', 'eth0', '', 'K8S_POD_NAMESPACE=;K8S_POD_NAMESPACE=kube-system', '{}'].join('\0'),
  );
  for (const h of HARNESSES) {
    const dir = path.join(out, 'corpus', h);
    mkdirSync(dir, { recursive: true });
    for (const [i, s] of seeds[h].entries()) writeFileSync(path.join(dir, `seed-${i}`), s);
  }
}

function run(bin, h) {
  const corpus = path.join(out, 'corpus', h);
  const artifacts = path.join(out, 'artifacts', h) + '/';
  mkdirSync(artifacts, { recursive: true });
  const args = [corpus, `-artifact_prefix=${artifacts}`, '-max_len=16384', '-rss_limit_mb=2048', '-timeout=10', '-print_final_stats=1', '-detect_leaks=1'];
  args.push(runs !== undefined ? `-runs=${runs}` : `-max_total_time=${seconds}`);
  return new Promise((resolve) => {
    const t0 = performance.now();
    const p = spawn(bin, args, { env: { ...process.env, ASAN_OPTIONS: 'detect_leaks=1:abort_on_error=1', UBSAN_OPTIONS: 'print_stacktrace=1:halt_on_error=1' }, stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    p.stderr.on('data', (d) => { err = (err + d).slice(-200_000); });
    p.on('close', (code, signal) => {
      const execs = Number(/stat::number_of_executed_units:\s*(\d+)/.exec(err)?.[1] ?? NaN);
      const cov = /cov: (\d+) ft: (\d+) corp: (\d+)/g;
      let m, last;
      while ((m = cov.exec(err))) last = m;
      const crashed = code !== 0 || signal !== null;
      const crashes = readdirSync(artifacts).filter((f) => /^(crash|leak|oom|timeout)-/.test(f));
      resolve({
        harness: h, execs, seconds: Math.round((performance.now() - t0) / 100) / 10,
        coverage: last ? Number(last[1]) : null, corpus: last ? Number(last[3]) : null,
        ok: !crashed && crashes.length === 0, exitCode: code, artifacts: crashes,
        report: crashed ? err.split('\n').filter((l) => /ERROR|SUMMARY|runtime error|leak|==\d+==/.test(l)).slice(0, 20).join('\n') : undefined,
      });
    });
  });
}

const cc = clang();
mkdirSync(out, { recursive: true });
seed();
const results = [];
for (const h of HARNESSES.filter((x) => !only || x === only)) {
  const bin = build(cc, h);
  const r = await run(bin, h);
  results.push(r);
  console.log(`${r.ok ? 'ok  ' : 'FAIL'} ${h}: ${r.execs.toLocaleString('en')} executions in ${r.seconds} s, coverage ${r.coverage} edges, corpus ${r.corpus}${r.ok ? '' : `, exit ${r.exitCode}, artifacts ${r.artifacts.join(' ')}\n${r.report}`}`);
}
const total = results.reduce((a, r) => a + r.execs, 0);
console.log(JSON.stringify({ fuzz: results.map(({ report: _r, ...x }) => x), totalExecs: total, ok: results.every((r) => r.ok) }));
process.exit(results.every((r) => r.ok) ? 0 : 1);
