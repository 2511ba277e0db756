import { describe, expect, it } from 'vitest';
import { createStepProgress, fmt } from '../../scripts/lib/progress.mjs';

describe('bench progress', () => {
  it('plain lines without a TTY: step n/N, elapsed, and an estimate from the pace so far', () => {
    let t = 0;
    const err: string[] = [];
    const out: string[] = [];
    const p = createStepProgress({ name: 'bench:x', total: 4, tty: false, now: () => t, write: (s: string) => err.push(s), out: (s: string) => out.push(s) });
    p.step('a');
    t = 10_000;
    p.step('b');
    p.log('result a');
    t = 20_000;
    p.done();
    expect(err).toEqual([
      'bench:x [1/4] a · elapsed 0s\n',
      'bench:x [2/4] b · elapsed 10s · ~30s left\n',
      'bench:x: 2/4 steps in 20s\n',
    ]);
    expect(out).toEqual(['result a\n']);
  });

  it('on a TTY one status line is rewritten, and cleared before a result line', () => {
    const err: string[] = [];
    const p = createStepProgress({ name: 'b', total: 2, tty: true, now: () => 0, write: (s: string) => err.push(s), out: () => undefined });
    p.step('a');
    p.log('r');
    expect(err).toEqual(['\r\x1b[2Kb [1/2] a · elapsed 0s', '\r\x1b[2K']);
  });

  it('formats durations', () => {
    expect([fmt(5), fmt(65), fmt(3725)]).toEqual(['5s', '1m05s', '1h02m']);
  });
});
