// bench:scale --peak-trace against a real process: a child that touches
// 48 MiB when told to. The trace must put its peak and its jump in the phase
// in which the child grew, and start over for a new pid.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { PeakTrace, peakTraceText } from '../../../bench/scale/peak-trace.js';

const GROW = 'process.stdin.once("data", () => { globalThis.b = Buffer.alloc(48 << 20, 1); process.stdout.write("grown\\n"); }); setInterval(() => {}, 1000);';
// 0.5 MiB every 20 ms, 80 times: 40 MiB in 1.6 s, never 2 MiB within the
// trace's 10 ms (nor between two readings unless one comes 60 ms late)
const CREEP = 'process.stdin.once("data", () => { globalThis.k = []; let n = 0; const t = setInterval(() => { k.push(Buffer.alloc(1 << 19, 1)); if (++n === 80) { clearInterval(t); process.stdout.write("grown\\n"); } }, 25); }); setInterval(() => {}, 1000);';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let children: ChildProcess[] = [];
let trace: PeakTrace | undefined;
afterEach(() => {
  for (const c of children) c.kill('SIGKILL');
  children = [];
  trace?.close();
  trace = undefined;
});

function child(script = GROW): ChildProcess {
  const c = spawn(process.execPath, ['-e', script], { stdio: ['pipe', 'pipe', 'inherit'] });
  children.push(c);
  return c;
}

/** A trace of c once node's own start-up is over, in phase `first` for `ms`. */
async function traceOf(c: ChildProcess, first: string, ms: number): Promise<PeakTrace> {
  await sleep(300);
  trace = new PeakTrace();
  trace.phase(first);
  trace.track(c.pid!);
  await sleep(ms);
  return trace;
}

async function grow(c: ChildProcess): Promise<void> {
  c.stdin!.write('go\n');
  await once(c.stdout!, 'data');
}

describe('peak trace (bench:scale --peak-trace)', () => {
  it('names the phase in which the traced process reached its peak, with the jump there', async () => {
    const c = child();
    const t = await traceOf(c, 'idle', 200);
    t.phase('grow');
    await grow(c);
    await sleep(50);
    t.phase('after');
    await sleep(100);
    const r = await t.stop();
    expect(r.phase).toBe('grow');
    expect(r.phases.grow! - r.phases.idle!).toBeGreaterThan(40);
    expect(r.peakMiB).toBeGreaterThanOrEqual(r.phases.grow!);
    expect(r.readings).toBeGreaterThan(100);
    const j = r.jumps.find((x) => x.phase === 'grow');
    expect(j, JSON.stringify(r.jumps)).toBeDefined();
    expect(j!.toMiB - j!.fromMiB).toBeGreaterThanOrEqual(2);
    expect(r.jumps.some((x) => x.phase === 'idle')).toBe(false);
    // the phases start in order, ~200 ms (idle) then ~50 ms (grow) apart, and the peak falls inside grow
    expect(r.phaseStartS.idle!).toBeLessThan(r.phaseStartS.grow!);
    expect(r.phaseStartS.grow! - r.phaseStartS.idle!).toBeGreaterThan(0.15);
    expect(r.phaseStartS.after! - r.phaseStartS.grow!).toBeGreaterThan(0.04);
    expect(r.atS).toBeGreaterThanOrEqual(r.phaseStartS.grow!);
    expect(r.atS).toBeLessThan(r.phaseStartS.after!);
    expect(peakTraceText(r)).toMatch(/set in "grow" at [\d.]+ s after the traced agent's start \(0\.\d\d s into that phase\)/);
  });

  it('does not call a slow growth a jump, however much it adds up to', { timeout: 15_000 }, async () => {
    const c = child(CREEP);
    const t = await traceOf(c, 'before', 100);
    t.phase('creep');
    await grow(c);
    const r = await t.stop();
    expect(r.phases.creep! - r.phases.before!).toBeGreaterThan(35);
    expect(r.jumps, JSON.stringify(r.jumps)).toEqual([]);
    expect(r.jumpCount).toBe(0);
  });

  it('starts over for a new pid (a restarted agent has a VmHWM of its own)', async () => {
    const big = child();
    const small = child();
    await sleep(300);
    await grow(big);
    trace = new PeakTrace();
    trace.phase('first agent');
    trace.track(big.pid!);
    await sleep(100);
    trace.phase('second agent');
    trace.track(small.pid!);
    await sleep(100);
    const r = await trace.stop();
    const bigHwmMiB = Number(/^VmHWM:\s+(\d+)/m.exec(readFileSync(`/proc/${big.pid}/status`, 'utf8'))![1]) / 1024;
    expect(r.phase).toBe('second agent');
    expect(r.peakMiB).toBeLessThan(bigHwmMiB - 30);
    expect(r.phases['first agent']).toBeUndefined();
  });
});
