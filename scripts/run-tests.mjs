#!/usr/bin/env node
// Runs the whole vitest suite (unit + privileged projects) and ends with the
// plain "N passed, N failed" line CI reads. Extra arguments go to vitest.
import { execa } from 'execa';
import { chmodSync, readFileSync, mkdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const out = path.join(root, 'build', 'vitest-report.json');
mkdirSync(path.dirname(out), { recursive: true });
if (process.getuid?.() !== 0) {
  console.error('run-tests: the privileged tests load BPF programs and create network namespaces: run as root');
  process.exit(1);
}
// Tests run the proxy and some CLI checks as uid 1337 / nobody, as a sidecar
// runs: those processes must reach this checkout. A clone under a private
// directory (mktemp -d makes 0700) fails every such test with EACCES, so the
// ancestors others cannot search get o+x (search only, not read) for the run
// and their own mode back afterwards, also on Ctrl-C.
const widened = [];
for (let d = root; ; d = path.dirname(d)) {
  const mode = statSync(d).mode & 0o7777;
  if (!(mode & 0o001)) {
    chmodSync(d, mode | 0o001);
    widened.push([d, mode]);
  }
  if (d === path.dirname(d)) break;
}
const restoreModes = () => {
  for (const [d, mode] of widened.splice(0)) {
    try { chmodSync(d, mode); } catch { /* gone */ }
  }
};
process.on('exit', restoreModes);
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => { restoreModes(); process.exit(130); });
if (widened.length) console.log(`run-tests: made searchable by other users for this run (the proxy runs as uid 1337), restored afterwards: ${widened.map(([d]) => d).join(', ')}`);

const r = await execa(path.join(root, 'node_modules/.bin/vitest'), ['run', '--reporter=default', '--reporter=json', `--outputFile.json=${out}`, ...process.argv.slice(2)], {
  cwd: root, stdio: 'inherit', reject: false,
});
let summary = null;
try {
  const j = JSON.parse(readFileSync(out, 'utf8'));
  // numFailedTestSuites also counts every describe around a failed test: a
  // file that failed to run is one whose status failed with no failed test
  const unrun = (j.testResults ?? []).filter((f) => f.status === 'failed' && !(f.assertionResults ?? []).some((a) => a.status === 'failed')).length;
  summary = { passed: j.numPassedTests, failed: j.numFailedTests + unrun, skipped: j.numPendingTests + j.numTodoTests, suites: unrun };
} catch (e) {
  console.error(`run-tests: no JSON report (${e.message})`);
}
if (summary && r.exitCode !== 0 && summary.failed === 0) {
  // e.g. an unhandled error outside any test: vitest fails the run, so must we
  console.log('(vitest failed the run for errors outside the tests: see above)');
  summary.failed = 1;
}
if (summary) {
  if (summary.suites) console.log(`(${summary.suites} test files failed to run)`);
  console.log(`${summary.passed} passed, ${summary.failed} failed${summary.skipped ? `, ${summary.skipped} skipped` : ''}`);
}
process.exit(r.exitCode ?? 1);
