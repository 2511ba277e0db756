// @ts-check
// A vitest reporter for the guests, beside the default one: prints each failed
// test's error the moment the test fails. The default reporter keeps errors
// for its end-of-run summary, which a run stopped by the VM limit never
// reaches (the sandbox's failures on loaded 5.10 guests went unseen that way).
// Lines start with MESHCAP-TEST-FAILED, never with FAIL, so lib/report.mjs's
// parsing of vitest's own summary is unchanged.

/** Lines of one error worth printing: the message (with the test's own context, e.g. a log) and where it was thrown. */
const MAX_LINES = 80;

/**
 * @param {string} what
 * @param {ReadonlyArray<import('@vitest/utils').TestError>} errors
 */
function print(what, errors) {
  const out = [`MESHCAP-TEST-FAILED ${what}`];
  for (const e of errors) {
    const msg = `${e.name ?? 'Error'}: ${e.message ?? ''}`.split('\n');
    const at = (e.stack ?? '').split('\n').filter((l) => /^\s+at /.test(l) && !l.includes('node_modules') && !l.includes('<anonymous>')).slice(0, 3);
    const lines = [...msg, ...(e.diff ? String(e.diff).split('\n') : []), ...at];
    out.push(...lines.slice(0, MAX_LINES).map((l) => `    ${l}`));
    if (lines.length > MAX_LINES) out.push(`    ... (${lines.length - MAX_LINES} more lines)`);
  }
  process.stdout.write(out.join('\n') + '\n');
}

export default class FailedNow {
  /** @param {import('vitest/node').TestCase} testCase */
  onTestCaseResult(testCase) {
    const r = testCase.result();
    if (r.state === 'failed') print(`${testCase.module.relativeModuleId} > ${testCase.fullName}`, r.errors ?? []);
  }

  /** A file that failed outside its tests (import, collection, a beforeAll/afterAll hook). @param {import('vitest/node').TestModule} m */
  onTestModuleEnd(m) {
    const errs = m.errors();
    if (errs.length) print(`${m.relativeModuleId} (the file itself)`, errs);
    for (const s of m.children.allSuites()) {
      const se = s.errors();
      if (se.length) print(`${m.relativeModuleId} > ${s.fullName} (the suite's hooks)`, se);
    }
  }
}
