// The datapath bench's pure parts (bench/datapath/report.ts) and its runner:
// bench/lib/ts.mjs must keep running the TypeScript drivers from source, as
// `npm run bench:datapath` and `bench:reconcile` do.
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { describe, expect, it } from 'vitest';
import { medianInterval, summarize, table } from '../../../bench/datapath/report.js';
import type { RoundResult } from '../../../bench/datapath/run.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

const r = (round: number, mode: RoundResult['mode'], opsPerSec: number): RoundResult => ({
  round, leg: 'echo', mode, testName: 'rr1', test: 'rr', size: 1, ops: opsPerSec, opsPerSec, connects: 1, p50us: 10, p99us: 20,
});

describe('bench:datapath report', () => {
  it('rates are medians over rounds; ratios are medians of per-round paired ratios', () => {
    const s = summarize([r(0, 'iptables', 100), r(0, 'ebpf', 120), r(1, 'iptables', 50), r(1, 'ebpf', 75), r(2, 'iptables', 100), r(2, 'ebpf', 110)]);
    const ebpf = s.find((x) => x.mode === 'ebpf')!;
    expect(ebpf.rate).toBe(110);
    expect(ebpf.vsIptables).toEqual({ median: 1.2, min: 1.1, max: 1.5, ci95: [1.1, 1.5] }); // 3 rounds: the interval is [min, max]
    expect(ebpf.vsDirect).toBeNull();
    expect(table(s, ['echo'], ['rr1'], ['iptables', 'ebpf'])).toMatch(/ebpf\s+110\s+±/);
  });

  it('overhead above direct is µs per operation, paired per round; the distribution is the median per quantile', () => {
    const cdf = (us: number): [number, number][] => [[0.5, us], [0.99, us * 2]];
    const s = summarize([
      { ...r(0, 'direct', 100_000), cdf: cdf(10) }, { ...r(0, 'ebpf', 50_000), cdf: cdf(20) },
      { ...r(1, 'direct', 50_000), cdf: cdf(12) }, { ...r(1, 'ebpf', 40_000), cdf: cdf(30) },
      { ...r(2, 'direct', 100_000), cdf: cdf(11) }, { ...r(2, 'ebpf', 80_000), cdf: cdf(25) },
    ]);
    const ebpf = s.find((x) => x.mode === 'ebpf')!;
    // per round: 20 − 10, 25 − 20, 12.5 − 10 µs
    expect(ebpf.overDirectUs).toEqual({ median: 5, min: 2.5, max: 10 });
    expect(s.find((x) => x.mode === 'direct')!.overDirectUs).toEqual({ median: 0, min: 0, max: 0 });
    expect(ebpf.cdfUs).toEqual([[0.5, 25], [0.99, 50]]);
    expect(ebpf.overDirectP50Us).toEqual({ median: 0, min: 0, max: 0 }); // r() gives every round p50 10 µs
    expect(table(s, ['echo'], ['rr1'], ['direct', 'ebpf'])).toMatch(/ebpf .* \+5\.00 +\+0\.00$/m);
  });

  it('podsrc, the floor of a redirect that keeps the pod address, gets its own ratio column only when it ran', () => {
    const s = summarize([r(0, 'direct', 100), r(0, 'podsrc', 98), r(0, 'ebpf', 97), r(1, 'direct', 100), r(1, 'podsrc', 96), r(1, 'ebpf', 96)]);
    const ebpf = s.find((x) => x.mode === 'ebpf')!;
    expect(ebpf.vsPodsrc!.median).toBeCloseTo((97 / 98 + 96 / 96) / 2, 6);
    expect(table(s, ['echo'], ['rr1'], ['direct', 'podsrc', 'ebpf'])).toMatch(/×direct +×podsrc +×iptables/);
    expect(table(s, ['echo'], ['rr1'], ['direct', 'podsrc', 'ebpf'])).toMatch(/^ebpf +97 .* 0\.96× +0\.99× +- /m);
    expect(table(s, ['echo'], ['rr1'], ['direct', 'ebpf'])).not.toMatch(/podsrc/);
  });

  it('the median of a ratio carries a distribution-free 95% interval, printed once there are 10 rounds or more', () => {
    // order statistics at n/2 ∓ 1.96·√n/2: ranks 49 and 72 of 120 (1-based), whatever the order given
    const xs = Array.from({ length: 120 }, (_, i) => 120 - i);
    expect(medianInterval(xs)).toEqual([49, 72]);
    expect(medianInterval([3, 1, 2])).toEqual([1, 3]);
    expect(medianInterval([5])).toEqual([5, 5]);
    const rounds = (n: number) => Array.from({ length: n }, (_, i) => [r(i, 'direct', 100), r(i, 'podsrc', 99), r(i, 'ebpf', 90 + (i % 10))]).flat();
    const many = table(summarize(rounds(20)), ['echo'], ['rr1'], ['direct', 'podsrc', 'ebpf']);
    // ebpf's 20 ratios are 0.90..0.99 twice: ranks 6 and 16 → 0.92 and 0.97
    expect(many).toMatch(/^ +×direct, 95% interval of the median \(20 paired rounds\): podsrc 0\.990–0\.990 · ebpf 0\.920–0\.970$/m);
    expect(many).toMatch(/^ +×podsrc, 95% interval of the median \(20 paired rounds\): ebpf 0\.929–0\.980$/m);
    expect(table(summarize(rounds(9)), ['echo'], ['rr1'], ['direct', 'podsrc', 'ebpf'])).not.toMatch(/interval/);
  });

  it('the drivers run from source through bench/lib/ts.mjs (options are checked before anything is made)', async () => {
    const p = await execa(process.execPath, ['--import', './bench/lib/ts.mjs', 'bench/datapath/main.ts', '--tests', 'nope'], { cwd: root, reject: false });
    expect(p.exitCode).toBe(1);
    expect(p.stderr).toMatch(/unknown test nope: choose from rr1, rr100, crr, stream/);
  }, 20_000);
});
