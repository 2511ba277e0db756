// Hands the free pages inside glibc's malloc heap back to the kernel after
// the agent's bursts. At 10,000 pods ~12 MiB of the agent's brk heap was
// free but resident after a start and a burst of ADDs: chunks freed between
// ones still in use, which glibc's own trim (the heap's top only) never
// returns; malloc_trim(0) madvises them away (docs/bench-scale.md, issue 19
// item 5). Run after each major GC (the bursts that leave them end in one),
// at most once per interval, and when asked (after the start-up and each
// self-check pass), and after each of the start's two full GCs (collect()).
// MESHCAP_AGENT_MALLOC_TRIM=0 turns both off, MESHCAP_AGENT_SETTLE_GC=0 only
// the full GCs, to compare.
import { PerformanceObserver, constants } from 'node:perf_hooks';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { mallocTrim } from '../native/addon.js';

/**
 * V8's full GC. The DaemonSet does not pass --expose-gc, so the flag is set
 * here and the function taken from a fresh context (the global one was made
 * before the flag).
 */
function fullGc(): () => void {
  const g = (globalThis as { gc?: () => void }).gc;
  if (typeof g === 'function') return g;
  setFlagsFromString('--expose-gc');
  return runInNewContext('gc') as () => void;
}

export interface MallocTrimmer {
  /** A trim on a coming loop turn (or when the interval allows). */
  soon(): void;
  /**
   * A full GC now (its ms returned; undefined when switched off), then the
   * trim 100 ms later whatever the interval. For the start's garbage:
   * adopting 10,000 pods leaves ~9 MiB of V8 heap and ~9 MiB of malloc'd
   * memory that only a GC frees (brk heap 15.0 -> 5.6 MiB, V8 heap used
   * 31.8 -> 23.2 MiB in a measured start), which V8 collects only when the
   * heap grows again, on top of which the first burst of CNI operations then
   * peaked (docs/bench-scale.md, round 6).
   */
  collect(): number | undefined;
  /** How many full GCs collect() ran. */
  readonly collections: number;
  /** How many trims ran. */
  readonly trims: number;
  close(): void;
}

/** How long collect() gives V8's background sweeping before its trim. */
const SWEEP_WAIT_MS = 100;

export function startMallocTrimmer(o: { minIntervalMs?: number; env?: NodeJS.ProcessEnv } = {}): MallocTrimmer {
  const minInterval = o.minIntervalMs ?? 1000;
  let trims = 0;
  let collections = 0;
  const env = o.env ?? process.env;
  if (env.MESHCAP_AGENT_MALLOC_TRIM === '0') return { soon: () => undefined, collect: () => undefined, get trims() { return trims; }, collections: 0, close: () => undefined };
  const gc = fullGc();
  let last = -Infinity;
  let pending: NodeJS.Immediate | NodeJS.Timeout | undefined;
  const cancel = () => {
    clearTimeout(pending as NodeJS.Timeout);
    clearImmediate(pending as NodeJS.Immediate);
    pending = undefined;
  };
  const run = () => {
    pending = undefined;
    last = performance.now();
    trims++;
    mallocTrim();
  };
  const soon = () => {
    if (pending) return;
    const wait = last + minInterval - performance.now();
    // after the current work (a GC ends inside some JS), or once the interval has passed
    pending = wait <= 0 ? setImmediate(run) : setTimeout(run, wait);
    pending.unref();
  };
  const obs = new PerformanceObserver((list) => {
    if (list.getEntries().some((e) => ((e as { detail?: { kind?: number } }).detail)?.kind === constants.NODE_PERFORMANCE_GC_MAJOR)) soon();
  });
  obs.observe({ entryTypes: ['gc'] });
  return {
    soon,
    collect() {
      if (env.MESHCAP_AGENT_SETTLE_GC === '0') return undefined;
      collections++;
      const t0 = performance.now();
      gc();
      const ms = performance.now() - t0;
      // The trim whatever the interval (what the GC freed is what it is
      // for), a moment later: V8 frees dead ArrayBuffers' backing stores on a
      // background thread after the GC, not within it.
      cancel();
      pending = setTimeout(run, SWEEP_WAIT_MS);
      pending.unref();
      return ms;
    },
    get trims() {
      return trims;
    },
    get collections() {
      return collections;
    },
    close() {
      obs.disconnect();
      cancel();
    },
  };
}
