// @ts-check
// Reading results out of a step's console output: vitest's summary counts,
// the mode `meshcap probe --json` chose, and the verifier's words when a BPF
// program was rejected. Pure functions over lines of text.

/**
 * vitest's closing "Tests  1 failed | 10 passed | 2 skipped (13)" line.
 * @param {string[]} lines
 * Also its "Errors  1 error" line: unhandled errors fail the run with all
 * tests passed.
 * @returns {{ passed: number, failed: number, skipped: number, total: number, errors: number } | null}
 */
export function parseVitestSummary(lines) {
  for (let i = lines.length - 1; i >= 0; i--) {
    const m = /^\s*Tests\s+(.+?)\s+\((\d+)\)\s*$/.exec(lines[i]);
    if (!m) continue;
    const count = (word) => Number(new RegExp(`(\\d+) ${word}`).exec(m[1])?.[1] ?? 0);
    const errors = lines.slice(i + 1, i + 4).map((l) => /^\s*Errors\s+(\d+) error/.exec(l)).find(Boolean);
    return {
      passed: count('passed'), failed: count('failed'), skipped: count('skipped') + count('todo'), total: Number(m[2]),
      errors: errors ? Number(errors[1]) : 0,
    };
  }
  return null;
}

/**
 * The mode in `meshcap probe --json` output: the first JSON object in the
 * output that has a "mode" of ebpf or iptables, at the top or nested.
 * @param {string[]} lines
 * @returns {{ mode: 'ebpf'|'iptables', json: unknown } | null}
 */
export function parseProbeMode(lines) {
  const text = lines.join('\n');
  for (let start = text.indexOf('{'); start >= 0; start = text.indexOf('{', start + 1)) {
    for (let end = text.lastIndexOf('}'); end > start; end = text.lastIndexOf('}', end - 1)) {
      let json;
      try { json = JSON.parse(text.slice(start, end + 1)); } catch { continue; }
      const mode = findMode(json);
      if (mode) return { mode, json };
      break;
    }
  }
  return null;
}

/** @param {unknown} v @returns {'ebpf'|'iptables'|null} */
function findMode(v) {
  if (!v || typeof v !== 'object') return null;
  const o = /** @type {Record<string, unknown>} */ (v);
  if (o.mode === 'ebpf' || o.mode === 'iptables') return o.mode;
  for (const child of Object.values(o)) {
    const m = findMode(child);
    if (m) return m;
  }
  return null;
}

// What libbpf, bpftool and the kernel's verifier print when a program is
// rejected; the verifier's own last lines say why.
const VERIFIER = [
  /BEGIN PROG LOAD LOG|END PROG LOAD LOG/,
  /BPF program load failed|failed to load (BPF )?program|prog '[^']+': (failed|BPF)/i,
  /verifier|invalid (func|mem|access|argument|bpf_context|indirect|size|stack)|unknown func|R\d+ (invalid|!read_ok|type=)/i,
  /processed \d+ insns|program is too large|back-edge|unreachable insn|misaligned|not allowed|expected=|helper call is not allowed/i,
];

// The probe's refusal of eBPF mode quotes the trial load's verifier line: on a
// kernel expected to refuse it (5.10) that is the answer the tests assert, and
// a test's output or error that repeats it is not a rejection to report.
const REFUSAL = /eBPF mode refused on this node|objects\.verified missing/;

/**
 * Lines that say a BPF program was rejected, at most `max` of them (the
 * verifier log can run to thousands of lines; its end says why).
 * @param {string[]} lines
 * @param {number} [max]
 */
export function verifierLines(lines, max = 25) {
  const hits = [];
  const seen = new Set();
  let inLog = false;
  for (const l of lines) {
    if (/BEGIN PROG LOAD LOG/.test(l)) inLog = true;
    // The same rejection repeats once per test that loads the object: say it once.
    if (inLog) hits.push(l.trimEnd());
    else if (VERIFIER.some((re) => re.test(l)) && !REFUSAL.test(l) && !seen.has(l.trim())) {
      seen.add(l.trim());
      hits.push(l.trimEnd());
    }
    if (/END PROG LOAD LOG/.test(l)) inLog = false;
  }
  if (hits.length <= max) return hits;
  return [...hits.slice(0, 5), `... (${hits.length - max} lines omitted)`, ...hits.slice(-(max - 6))];
}

/**
 * The lines of a failed step worth showing: vitest's failure headers and
 * assertion messages, else the output's tail.
 * @param {string[]} lines
 * @param {number} [max]
 */
export function failureLines(lines, max = 15) {
  const picked = lines.filter((l) => /FAIL|Error|AssertionError|expected|✗|×|smoke: FAILED|not ok/.test(l));
  const src = picked.length ? picked : lines.filter((l) => l.trim());
  return src.slice(-max).map((l) => l.trimEnd());
}

const FAIL_HEADER = /^\s*FAIL\s/;

/**
 * vitest's failure blocks: each " FAIL  file > suite > test" header with the
 * error line below it. Tests that failed for the same error are listed by
 * vitest as consecutive headers over one error; they stay one group here.
 * @param {string[]} lines
 * @returns {{ tests: string[], why: string | null }[]}
 */
export function failedTests(lines) {
  const groups = [];
  for (let i = 0; i < lines.length; i++) {
    if (!FAIL_HEADER.test(lines[i])) continue;
    const tests = [];
    while (i < lines.length && (FAIL_HEADER.test(lines[i]) || !lines[i].trim())) {
      if (lines[i].trim()) tests.push(lines[i].trim().replace(/^FAIL\s+/, ''));
      i++;
    }
    const why = i < lines.length ? lines[i].trim() : null;
    groups.push({ tests, why });
  }
  return groups;
}

/** @param {string} l @param {number} [max] */
export const clip = (l, max = 300) => (l.length > max ? `${l.slice(0, max - 1)}…` : l);
