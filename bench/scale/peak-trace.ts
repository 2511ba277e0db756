// bench:scale --peak-trace: the agent's VmHWM and VmRSS read about every
// millisecond on a worker thread, so a run says in which of its phases the
// agent's lifetime peak was set and which readings jumped. The bench's own
// 20 ms watch misses spikes of a few milliseconds: the registering agent's
// remaining one is a major GC inside a self-check pass (docs/bench-scale.md,
// "2026-11-29, 17:45–19:10 UTC"). Opt-in: the reads cost ~6% of a CPU,
// which the other figures of a run would carry.
import { Worker } from 'node:worker_threads';

/**
 * A rise of RSS of at least JUMP_KIB within RISE_MS: consecutive readings
 * that never fall, taken together. Not between two readings alone: a rise
 * spread over a few readings (page faults at ~2 MiB per ms here, slower on
 * a loaded host) would then be missed or not, by the cadence of the reads.
 */
export interface Jump { phase: string; atS: number; ms: number; fromMiB: number; toMiB: number }
export interface PeakTraceReport {
  /** The traced agent's VmHWM and where the last rise to it was read. */
  peakMiB: number;
  phase: string;
  atS: number;
  /** The highest RSS read in each phase (a spike between two readings shows in VmHWM only). */
  phases: Record<string, number>;
  /** When each phase's first reading was taken, s after the traced agent's start (where in its phase the peak fell). */
  phaseStartS: Record<string, number>;
  /** How many rises of JUMP_KIB or more within RISE_MS there were. */
  jumpCount: number;
  /** The largest of those in each phase, at most JUMPS_PER_PHASE each, largest first. */
  jumps: Jump[];
  readings: number;
}

const JUMP_KIB = 2048;
/** A rise that goes on longer is cut here (and a new one starts): slow growth is not a jump. */
const RISE_MS = 10;
const JUMPS_PER_PHASE = 3;

// Plain JS (the worker is not run through the bench's TypeScript loader).
// ctl: [0] stop, [1] phase index, [2] pid (0: none yet; a new pid starts over)
const WORKER = `
const { workerData, parentPort } = require('node:worker_threads');
const { readFileSync } = require('node:fs');
const ctl = new Int32Array(workerData.sab);
const nap = new Int32Array(new SharedArrayBuffer(4));
let pid = 0, t0 = 0, hwm = 0, at = 0, phaseAt = -1, prev = 0, prevT = 0, readings = 0;
let phases = {}, starts = {}, jumps = [], jumpCount = 0;
// the rise under way: from its first reading's RSS and time to prev
let riseFrom = 0, riseT = 0, risePh = 0;
const endRise = () => {
  if (prev - riseFrom >= ${JUMP_KIB}) {
    jumpCount++;
    if (jumps.length < 1000) jumps.push([risePh, riseT, prevT - riseT, riseFrom, prev]);
  }
};
const kib = (st, k) => { const i = st.indexOf(k + ':'); return i < 0 ? NaN : parseInt(st.slice(i + k.length + 1), 10); };
while (Atomics.load(ctl, 0) === 0) {
  const p = Atomics.load(ctl, 2);
  if (p !== pid) {
    pid = p; t0 = performance.now(); hwm = 0; at = 0; phaseAt = -1; prev = 0; prevT = 0; readings = 0; phases = {}; starts = {}; jumps = []; jumpCount = 0;
  }
  if (pid !== 0) {
    let st;
    try { st = readFileSync('/proc/' + pid + '/status', 'latin1'); } catch { st = undefined; }
    const h = st === undefined ? NaN : kib(st, 'VmHWM');
    if (!Number.isNaN(h)) {
      const rss = kib(st, 'VmRSS');
      const ph = Atomics.load(ctl, 1);
      const t = performance.now() - t0;
      readings++;
      if (h > hwm) { hwm = h; at = t; phaseAt = ph; }
      if (rss > (phases[ph] ?? 0)) phases[ph] = rss;
      if (starts[ph] === undefined) starts[ph] = t;
      if (prev === 0) { riseFrom = rss; riseT = t; risePh = ph; }
      else if (rss < prev || t - riseT > ${RISE_MS}) {
        endRise();
        // a fall starts the next rise at the low; a cut one goes on from where it was cut
        if (rss < prev) { riseFrom = rss; riseT = t; } else { riseFrom = prev; riseT = prevT; }
        risePh = ph;
      }
      // the phase a rise is charged to: the one in which it gained most recently
      if (rss > prev && prev > 0) risePh = ph;
      prev = rss; prevT = t;
    }
  }
  Atomics.wait(nap, 0, 0, 1);
}
if (prev > 0) endRise();
parentPort.postMessage({ hwm, at, phaseAt, phases, starts, jumps, jumpCount, readings });
`;

export class PeakTrace {
  private readonly ctl = new Int32Array(new SharedArrayBuffer(12));
  private readonly names: string[] = [];
  private readonly worker: Worker;
  private readonly done: Promise<{ hwm: number; at: number; phaseAt: number; phases: Record<string, number>; starts: Record<string, number>; jumps: [number, number, number, number, number][]; jumpCount: number; readings: number }>;

  constructor() {
    this.worker = new Worker(WORKER, { eval: true, workerData: { sab: this.ctl.buffer } });
    this.done = new Promise((resolve, reject) => {
      this.worker.once('message', resolve);
      this.worker.once('error', reject);
      this.worker.once('exit', (code) => reject(new Error(`the peak trace's worker exited (${code}) before its report`)));
    });
    // a run that fails before stop() closes the trace: its report is not wanted then
    this.done.catch(() => undefined);
  }

  /** Ends the worker without a report (a run that failed). */
  close(): void {
    Atomics.store(this.ctl, 0, 1);
    void this.worker.terminate();
  }

  /** Traces this agent process from now on (a restarted agent starts over: its VmHWM is its own). */
  track(pid: number): void {
    Atomics.store(this.ctl, 2, pid);
  }

  /** Names what the bench does from now on. */
  phase(name: string): void {
    let i = this.names.indexOf(name);
    if (i < 0) i = this.names.push(name) - 1;
    Atomics.store(this.ctl, 1, i);
  }

  async stop(): Promise<PeakTraceReport> {
    Atomics.store(this.ctl, 0, 1);
    const r = await this.done;
    await this.worker.terminate();
    const name = (i: number) => this.names[i] ?? '(before the first phase)';
    const mib = (k: number) => Math.round(k / 10.24) / 100;
    return {
      peakMiB: mib(r.hwm),
      phase: name(r.phaseAt),
      atS: Math.round(r.at) / 1000,
      phases: Object.fromEntries(Object.entries(r.phases).map(([i, k]) => [name(Number(i)), mib(k)])),
      phaseStartS: Object.fromEntries(Object.entries(r.starts).map(([i, t]) => [name(Number(i)), Math.round(t) / 1000])),
      jumpCount: r.jumpCount,
      jumps: r.jumps
        .sort((a, b) => (b[4] - b[3]) - (a[4] - a[3]))
        .filter((j, k, all) => all.slice(0, k).filter((o) => o[0] === j[0]).length < JUMPS_PER_PHASE)
        .map(([i, t, ms, from, to]) => ({ phase: name(i), atS: Math.round(t) / 1000, ms: Math.round(ms * 10) / 10, fromMiB: mib(from), toMiB: mib(to) })),
      readings: r.readings,
    };
  }
}

export function peakTraceText(r: PeakTraceReport): string {
  const into = r.phaseStartS[r.phase];
  const big = r.jumps.find((j) => j.phase === r.phase);
  const jumps = `${r.jumpCount} rises of 2 MiB or more within ${RISE_MS} ms; ${big ? `in that phase the largest was +${(big.toMiB - big.fromMiB).toFixed(1)} to ${big.toMiB.toFixed(1)} MiB in ${big.ms} ms at ${big.atS.toFixed(2)} s` : 'none in that phase'}`;
  return `agent VmHWM ${r.peakMiB.toFixed(1)} MiB (${(r.peakMiB * 1.048576).toFixed(1)} MB), set in "${r.phase}" at ${r.atS.toFixed(2)} s after the traced agent's start${into === undefined ? '' : ` (${(r.atS - into).toFixed(2)} s into that phase)`} (${r.readings} readings); ${jumps}`;
}
