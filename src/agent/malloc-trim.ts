// Hands the free pages inside glibc's malloc heap back to the kernel after
// the agent's bursts. At 10,000 pods ~12 MiB of the agent's brk heap was
// free but resident after a start and a burst of ADDs: chunks freed between
// ones still in use, which glibc's own trim (the heap's top only) never
// returns; malloc_trim(0) madvises them away (docs/bench-scale.md, issue 19
// item 5). Run after each major GC (the bursts that leave them end in one),
// at most once per interval, and when asked (after the start-up and each
// self-check pass), and after each of the start's two full GCs (collect()).
// Over the soft limit (MESHCAP_AGENT_SOFT_LIMIT_MIB, 90 by default) it trims
// every 250 ms and runs a full GC at most once a second (below).
// MESHCAP_AGENT_MALLOC_TRIM=0 turns all of it off, MESHCAP_AGENT_SETTLE_GC=0
// only the start's full GCs, to compare.
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
  /** How many full GCs the soft limit ran. */
  readonly limitGcs: number;
  close(): void;
}

/** At most one trim per second for the major GCs' and the passes' asks. */
const DEFAULT_INTERVAL_MS = 1000;

/** How long collect() gives V8's background sweeping before its trim. */
const SWEEP_WAIT_MS = 100;

/**
 * The soft limit. Every 250 ms the trimmer reads the RSS; above the limit it
 * trims, and if that is not enough, runs a full GC (at most once a second,
 * backing off to once a minute while GCs cannot bring it under: the live set
 * is over). V8 lets its old space grow well past what it kept at its last
 * major GC before it collects, and the malloc heap keeps what bursts free:
 * at 10,000 pods a burst of 9,990 CNI DELs (a node drained) carried the
 * agent ~8 MiB over its resting RSS and over its 100 MB budget
 * (docs/bench-scale.md). GOMEMLIMIT does this for Go.
 * MESHCAP_AGENT_SOFT_LIMIT_MIB sets it (0 turns it off).
 */
const DEFAULT_SOFT_LIMIT_MIB = 90;
const WATCH_MS = 250;
const LIMIT_GC_MIN_MS = 1000;
const LIMIT_GC_MAX_MS = 60_000;

export function softLimitBytes(env: NodeJS.ProcessEnv): number {
  const v = env.MESHCAP_AGENT_SOFT_LIMIT_MIB;
  if (v === undefined || v === '') return DEFAULT_SOFT_LIMIT_MIB * 1048576;
  if (!/^[0-9]{1,6}$/.test(v)) throw new Error(`MESHCAP_AGENT_SOFT_LIMIT_MIB must be a whole number of MiB (0 turns the soft limit off), got ${JSON.stringify(v)}`);
  return Number(v) * 1048576;
}

export interface MallocTrimmerOptions {
  minIntervalMs?: number;
  env?: NodeJS.ProcessEnv;
  /** The RSS in bytes (default process.memoryUsage.rss). */
  rss?: () => number;
  /** A full GC left the RSS over the soft limit, after one that had not: the live set is over it. */
  onOverLimit?: (rssBytes: number, limitBytes: number) => void;
}

export function startMallocTrimmer(o: MallocTrimmerOptions = {}): MallocTrimmer {
  const minInterval = o.minIntervalMs ?? DEFAULT_INTERVAL_MS;
  let trims = 0;
  let collections = 0;
  let limitGcs = 0;
  const env = o.env ?? process.env;
  const softLimit = softLimitBytes(env);
  const rss = o.rss ?? (() => process.memoryUsage.rss());
  if (env.MESHCAP_AGENT_MALLOC_TRIM === '0') return { soon: () => undefined, collect: () => undefined, get trims() { return trims; }, collections: 0, limitGcs: 0, close: () => undefined };
  const gc = fullGc();
  let last = -Infinity;
  let pending: NodeJS.Immediate | NodeJS.Timeout | undefined;
  const cancel = () => {
    clearTimeout(pending as NodeJS.Timeout);
    clearImmediate(pending as NodeJS.Immediate);
    pending = undefined;
  };
  let limitGcAt = 0;
  let limitGcEvery = LIMIT_GC_MIN_MS;
  let checkAfterLimitGc = false;
  const run = () => {
    pending = undefined;
    last = performance.now();
    trims++;
    mallocTrim();
    if (softLimit === 0 || (!checkAfterLimitGc && last < limitGcAt + limitGcEvery)) return;
    const now = rss();
    const over = now > softLimit;
    if (checkAfterLimitGc) {
      // the trim after a limit GC: still over means the live set is, so back off
      checkAfterLimitGc = false;
      if (over && limitGcEvery === LIMIT_GC_MIN_MS) o.onOverLimit?.(now, softLimit);
      limitGcEvery = over ? Math.min(limitGcEvery * 2, LIMIT_GC_MAX_MS) : LIMIT_GC_MIN_MS;
      return;
    }
    if (!over) return;
    limitGcAt = last;
    limitGcs++;
    gc();
    checkAfterLimitGc = true;
    pending = setTimeout(run, SWEEP_WAIT_MS);
    pending.unref();
  };
  const soon = () => {
    if (pending) return;
    const wait = last + minInterval - performance.now();
    // after the current work (a GC ends inside some JS), or once the interval has passed
    pending = wait <= 0 ? setImmediate(run) : setTimeout(run, wait);
    pending.unref();
  };
  const watch = softLimit > 0 ? setInterval(() => {
    if (!pending && rss() > softLimit) run();
  }, WATCH_MS) : undefined;
  watch?.unref();
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
    get limitGcs() {
      return limitGcs;
    },
    close() {
      clearInterval(watch);
      obs.disconnect();
      cancel();
    },
  };
}
