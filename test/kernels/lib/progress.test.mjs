import { describe, expect, it } from 'vitest';
import { createProgress, fmt } from './progress.mjs';

function clock() {
  let t = 0;
  return { now: () => t, advance: (/** @type {number} */ s) => { t += s * 1000; } };
}

describe('test:kernels progress', () => {
  it('without a TTY: one plain line per event, step start and end, with elapsed time; no JSON, no escape codes', () => {
    let out = '';
    const c = clock();
    const p = createProgress({ write: (s) => (out += s), tty: false, kernels: 2, now: c.now });
    p.log('booting', { kernel: '6.1', steps: ['probe', 'privileged'] });
    p.kernelStart('6.1');
    c.advance(20);
    p.stepBegin('privileged');
    c.advance(95);
    p.tick();
    p.stepEnd('privileged', 0, 95);
    p.kernelEnd(true);
    expect(out).toBe([
      'test:kernels     0s  booting (kernel=6.1 steps=probe,privileged)',
      'test:kernels     0s  [6.1] kernel 1/2',
      'test:kernels    20s  [6.1] step privileged started',
      'test:kernels  1m55s  [6.1] step privileged ok in 1m35s',
      'test:kernels  1m55s  [6.1] done in 1m55s',
      '',
    ].join('\n'));
    expect(out).not.toMatch(/[{}]|\x1b/);
  });

  it('on a TTY: a status line with the step, elapsed and remaining time, rewritten in place and cleared before each line', () => {
    let out = '';
    const c = clock();
    const p = createProgress({ write: (s) => (out += s), tty: true, kernels: 3, now: c.now, typicalKernelSeconds: 600 });
    p.kernelStart('5.10');
    c.advance(60);
    p.stepBegin('privileged');
    c.advance(30);
    out = '';
    p.tick();
    expect(out).toBe('\r\x1b[2K[5.10 1/3] · privileged 30s · elapsed 1m30s · ~28m30s left');
    p.stepEnd('privileged', 1, 30);
    expect(out).toContain('\r\x1b[2Ktest:kernels  1m30s  [5.10] step privileged exit 1 in 30s\n');
    p.kernelEnd(false);
    c.advance(10);
    p.kernelStart('6.1');
    c.advance(30);
    out = '';
    p.tick();
    // the pace now comes from the finished kernel (90 s): 2 kernels x 90 s - 30 s into this one
    expect(out).toBe('\r\x1b[2K[6.1 2/3] · booting · elapsed 2m10s · ~2m30s left');
  });

  it('formats durations', () => {
    expect([fmt(0), fmt(59.6), fmt(61), fmt(3600), fmt(3725)]).toEqual(['0s', '1m00s', '1m01s', '1h00m', '1h02m']);
  });
});
