import { describe, expect, it } from 'vitest';
import { abortable, Cleanup, SignalAbort, sleep } from '../../../src/sandbox/cleanup.js';
import { Screen } from '../../../src/sandbox/screen.js';

describe('sandbox cleanup registry', () => {
  it('undoes in reverse order, keeps going past a failure, and reports each step', async () => {
    const c = new Cleanup();
    const order: string[] = [];
    c.add('run dir', () => order.push('run dir'));
    c.add('bridge', async () => {
      order.push('bridge');
      throw new Error('busy');
    });
    c.add('pod', () => order.push('pod'));
    const steps = await c.run();
    expect(order).toEqual(['pod', 'bridge', 'run dir']);
    expect(steps.map((s) => [s.label, s.error])).toEqual([['pod', undefined], ['bridge', 'busy'], ['run dir', undefined]]);
  });

  it('runs once, however often it is asked, and refuses late registrations', async () => {
    const c = new Cleanup();
    let n = 0;
    c.add('x', () => n++);
    const [a, b] = await Promise.all([c.run(), c.run()]);
    expect(a).toBe(b);
    expect(n).toBe(1);
    expect(() => c.add('late', () => undefined)).toThrow(/created too late/);
  });

  it('sleep and abortable end with the abort reason', async () => {
    const ctl = new AbortController();
    const t0 = Date.now();
    const s = sleep(10_000, ctl.signal);
    const a = abortable(new Promise(() => undefined), ctl.signal);
    ctl.abort(new SignalAbort('SIGINT'));
    await expect(s).rejects.toThrow('interrupted by SIGINT');
    await expect(a).rejects.toBeInstanceOf(SignalAbort);
    expect(Date.now() - t0).toBeLessThan(1000);
    await expect(sleep(1, ctl.signal)).rejects.toBeInstanceOf(SignalAbort);
  });
});

describe('sandbox screen', () => {
  it('without a terminal: lines as they come, the table once when committed', () => {
    let out = '';
    const s = new Screen({ write: (x: string) => (out += x) }, false);
    s.log('a');
    s.setBlock('T1');
    s.setBlock('T2\nT2b');
    s.log('b');
    s.commit();
    expect(out).toBe('a\nb\nT2\nT2b\n');
  });

  it('on a terminal: the table is redrawn in place below the log lines', () => {
    let out = '';
    const s = new Screen({ write: (x: string) => (out += x) }, true);
    s.setBlock('T1\nT1b');
    s.setBlock('T2\nT2b');
    s.log('line');
    s.commit();
    s.log('after');
    expect(out).toBe('T1\nT1b\n' + '\x1b[2F\x1b[J' + 'T2\nT2b\n' + '\x1b[2F\x1b[J' + 'line\nT2\nT2b\n' + 'after\n');
  });
});
