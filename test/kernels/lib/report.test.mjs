import { describe, expect, it } from 'vitest';
import { clip, failedTests, failureLines, parseProbeMode, parseVitestSummary, verifierLines } from './report.mjs';

describe('vitest summary', () => {
  it('reads passed/failed/skipped from the Tests line, not Test Files', () => {
    const out = [
      ' Test Files  1 failed | 3 passed (4)',
      '      Tests  2 failed | 40 passed | 1 skipped (43)',
      '   Start at  10:00:00',
    ];
    expect(parseVitestSummary(out)).toEqual({ passed: 40, failed: 2, skipped: 1, total: 43, errors: 0 });
  });
  it('counts unhandled errors, which fail a run whose tests all passed', () => {
    const out = ['      Tests  105 passed (105)', '     Errors  1 error', '   Start at  22:42:51'];
    expect(parseVitestSummary(out)).toMatchObject({ passed: 105, failed: 0, errors: 1 });
  });
  it('is null when vitest printed no summary (crash, no test files)', () => {
    expect(parseVitestSummary(['No test files found, exiting with code 1'])).toBeNull();
  });
});

describe('probe mode', () => {
  it('finds the mode in pretty JSON mixed with kernel messages', () => {
    const out = ['[  12.3] random: crng init done', '{', '  "kernel": "5.10.0-46-amd64",', '  "mode": "iptables",',
      '  "features": { "x": { "ok": false } }', '}'];
    expect(parseProbeMode(out)?.mode).toBe('iptables');
  });
  it('finds a nested mode', () => {
    expect(parseProbeMode(['{"decision":{"mode":"ebpf"}}'])?.mode).toBe('ebpf');
  });
  it('is null without a mode', () => {
    expect(parseProbeMode(['meshcap: dist/cli/main.js is missing'])).toBeNull();
    expect(parseProbeMode(['{"mode":"magic"}'])).toBeNull();
  });
});

describe('verifier lines', () => {
  // As printed by libbpf 1.1 for a program 5.10 rejects (captured from a VM run).
  const out = [
    ' FAIL  test/privileged/datapath/outbound.test.ts > loads',
    "libbpf: prog 'needs_coarse_clock': BPF program load failed: Invalid argument",
    "libbpf: prog 'needs_coarse_clock': -- BEGIN PROG LOAD LOG --",
    '; return bpf_ktime_get_coarse_ns() ? 1 : 1;',
    '0: (85) call unknown#160',
    'invalid func unknown#160',
    'processed 1 insns (limit 1000000) max_states_per_insn 0 total_states 0 peak_states 0 mark_read 0',
    '-- END PROG LOAD LOG --',
    'unrelated line',
  ];
  it('keeps the whole load log and the libbpf lines around it', () => {
    const v = verifierLines(out);
    expect(v).toContain('invalid func unknown#160');
    expect(v).toContain('0: (85) call unknown#160');
    expect(v).not.toContain('unrelated line');
  });
  it('keeps the head and the tail of a huge log', () => {
    const big = ['-- BEGIN PROG LOAD LOG --', ...Array.from({ length: 5000 }, (_, i) => `${i}: (b7) r0 = 0`), 'R1 invalid mem access', '-- END PROG LOAD LOG --'];
    const v = verifierLines(big, 25);
    expect(v).toHaveLength(25);
    expect(v.at(-2)).toBe('R1 invalid mem access');
  });
  it('says a rejection repeated by several tests once', () => {
    const e = "NativeError: bpf_object__load prog 'mc_sockops' of sockops.bpf.o: Invalid argument (EINVAL): unknown func bpf_get_netns_cookie#122";
    expect(verifierLines([e, ' FAIL  a', `  ${e}`, e])).toEqual([e]);
  });
  it('leaves out the probe\'s refusal of eBPF mode, which quotes the trial load', () => {
    const refusal = "eBPF mode: skipped, this kernel cannot run it: meshcap: eBPF mode refused on this node: objects.verified missing (needs Linux 5.15+): sockops.bpf.o: unknown func bpf_get_netns_cookie#122";
    expect(verifierLines([refusal, `    ${refusal}`, ' FAIL  x.test.ts > y'])).toEqual([]);
  });
  it('is empty when nothing was rejected', () => {
    expect(verifierLines([' FAIL  x.test.ts > y', 'AssertionError: expected 1 to be 2'])).toEqual([]);
  });
});

describe('failure lines', () => {
  it('prefers failure headers and assertion messages', () => {
    expect(failureLines(['ok', ' FAIL  a.test.ts > b', 'AssertionError: expected 1 to be 2', 'noise'])).toEqual(
      [' FAIL  a.test.ts > b', 'AssertionError: expected 1 to be 2']);
  });
});

describe('failed tests', () => {
  it('keeps consecutive FAIL headers as one group over the error vitest printed once', () => {
    // as 5.10 printed it: two tests, one error; then a test with its own error
    const out = [
      ' FAIL  |privileged| test/privileged/loader/pod-maps.test.ts > PodMaps > a',
      ' FAIL  |privileged| test/privileged/loader/pod-maps.test.ts > PodMaps > b',
      "NativeError: bpf_object__load prog 'mc_sockops': unknown func bpf_get_netns_cookie#122",
      ' ❯ src/native/addon.ts:166:38',
      '',
      ' FAIL  |privileged| test/privileged/native/maps.test.ts > LPM trie > batch',
      '',
      'NativeError: bpf_map_update_batch map fd 21 (3 of 3 written): errno 524 (ENOTSUPP)',
    ];
    expect(failedTests(out)).toEqual([
      {
        tests: ['|privileged| test/privileged/loader/pod-maps.test.ts > PodMaps > a', '|privileged| test/privileged/loader/pod-maps.test.ts > PodMaps > b'],
        why: "NativeError: bpf_object__load prog 'mc_sockops': unknown func bpf_get_netns_cookie#122",
      },
      { tests: ['|privileged| test/privileged/native/maps.test.ts > LPM trie > batch'], why: 'NativeError: bpf_map_update_batch map fd 21 (3 of 3 written): errno 524 (ENOTSUPP)' },
    ]);
  });
  it('has no error line for a header at the very end, and nothing without headers', () => {
    expect(failedTests([' FAIL  x > y'])).toEqual([{ tests: ['x > y'], why: null }]);
    expect(failedTests(['all good'])).toEqual([]);
  });
  it('clips long lines', () => {
    expect(clip('x'.repeat(500)).length).toBe(300);
    expect(clip('short')).toBe('short');
  });
});
