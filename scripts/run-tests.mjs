#!/usr/bin/env node
// Runs the whole vitest suite (unit + privileged projects) and ends with the
// plain "N passed, N failed" line CI reads. Extra arguments go to vitest.
import { execa } from 'execa';
import { readFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const out = path.join(root, 'build', 'vitest-report.json');
mkdirSync(path.dirname(out), { recursive: true });
if (process.getuid?.() !== 0) {
  console.error('run-tests: the privileged tests load BPF programs and create network namespaces: run as root');
  process.exit(1);
}
const r = await execa(path.join(root, 'node_modules/.bin/vitest'), ['run', '--reporter=default', '--reporter=json', `--outputFile.json=${out}`, ...process.argv.slice(2)], {
  cwd: root, stdio: 'inherit', reject: false,
});
let summary = null;
try {
  const j = JSON.parse(readFileSync(out, 'utf8'));
  summary = { passed: j.numPassedTests, failed: j.numFailedTests + (j.numFailedTestSuites ?? 0), skipped: j.numPendingTests + j.numTodoTests, suites: j.numFailedTestSuites };
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
