#!/usr/bin/env node
// npm run test:istio-diff -- [--seed S] [--runs N] [--pod-runs M] [--fate-runs F]
// The differential tests against the real Istio (docs/istio-compat.md) with a
// chosen seed and size: N generated istio-iptables invocations through
// istio-iptables and meshcap's renderer, M (default N) generated pods through
// istio-cni's ADD path and meshcap's decision, F (default 40) generated
// configs applied by istio-iptables and both meshcap modes with the
// connection matrix driven through each (fates). Ends with the renderer's line
// "N cases, N identical, N differ" (the pods' line just before it); exit 1 if
// anything differs.
import { execa } from 'execa';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const opts = { seed: String(Date.now() % 2_147_483_647), runs: '2000', podRuns: '', fateRuns: '40' };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const [flag, inline] = argv[i].split(/=(.*)/s, 2);
  const value = inline ?? argv[++i];
  const key = { '--seed': 'seed', '--runs': 'runs', '--pod-runs': 'podRuns', '--fate-runs': 'fateRuns' }[flag];
  if (!key || value === undefined || !/^\d+$/.test(value)) {
    console.error(`istio-diff: usage: npm run test:istio-diff -- [--seed S] [--runs N] [--pod-runs M] [--fate-runs F] (got ${JSON.stringify(argv[i])})`);
    process.exit(2);
  }
  opts[key] = value;
}
opts.podRuns ||= opts.runs;
const summary = path.join(tmpdir(), `meshcap-istio-diff-${process.pid}.json`);
console.log(`istio-diff: seed ${opts.seed}, ${opts.runs} istio-iptables cases, ${opts.podRuns} pods, ${opts.fateRuns} applied configs`);
const r = await execa(path.join(root, 'node_modules/.bin/vitest'), ['run', '--project', 'privileged', 'test/privileged/istio-diff/'], {
  cwd: root, stdio: 'inherit', reject: false,
  env: { ISTIO_DIFF_SEED: opts.seed, ISTIO_DIFF_RUNS: opts.runs, ISTIO_DIFF_POD_RUNS: opts.podRuns, ISTIO_DIFF_FATE_RUNS: opts.fateRuns, ISTIO_DIFF_SUMMARY: summary, ISTIO_DIFF_PROGRESS: '1' },
});
const read = (f) => (existsSync(f) ? JSON.parse(readFileSync(f, 'utf8')) : null);
const renderer = read(summary);
const pods = read(`${summary}.pods`);
const fates = read(`${summary}.fates`);
for (const f of [summary, `${summary}.pods`, `${summary}.fates`]) rmSync(f, { force: true });
if (fates) console.log(`connection fates (seed ${fates.seed}, ${(fates.ms / 1000).toFixed(1)} s, ${fates.connections} connections per mode): ${fates.configs} configs, ${fates.configs - fates.differ} identical, ${fates.differ} differ; eBPF named differences ${JSON.stringify(fates.allowed)}`);
else console.log('connection fates: no result (see the errors above)');
if (pods) console.log(`meshed-pod decision (seed ${pods.seed}, ${(pods.ms / 1000).toFixed(1)} s): ${pods.cases} cases, ${pods.identical} identical, ${pods.differ} differ`);
else console.log('meshed-pod decision: no result (see the errors above)');
if (!renderer) {
  console.log('istio-diff: the renderer test gave no result (see the errors above)');
  console.log(`0 cases, 0 identical, 0 differ`);
  process.exit(1);
}
console.log(`renderer (seed ${renderer.seed}, ${(renderer.ms / 1000).toFixed(1)} s, ${renderer.bothRejected} rejected by both):`);
console.log(`${renderer.cases} cases, ${renderer.identical} identical, ${renderer.differ} differ`);
process.exit(r.exitCode === 0 && renderer.differ === 0 && (!pods || pods.differ === 0) && (!fates || fates.differ === 0) ? 0 : 1);
