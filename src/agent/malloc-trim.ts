// Hands the free pages inside glibc's malloc heap back to the kernel after
// the agent's bursts. At 10,000 pods ~12 MiB of the agent's brk heap was
// free but resident after a start and a burst of ADDs: chunks freed between
// ones still in use, which glibc's own trim (the heap's top only) never
// returns; malloc_trim(0) madvises them away (docs/bench-scale.md, issue 19
// item 5). Run after each major GC (the bursts that leave them end in one),
// at most once per interval, and when asked (after the start-up and each
// self-check pass). MESHCAP_AGENT_MALLOC_TRIM=0 turns it off, to compare.
import { PerformanceObserver, constants } from 'node:perf_hooks';
import { mallocTrim } from '../native/addon.js';

export interface MallocTrimmer {
  /** A trim on a coming loop turn (or when the interval allows). */
  soon(): void;
  /** How many trims ran. */
  readonly trims: number;
  close(): void;
}

export function startMallocTrimmer(o: { minIntervalMs?: number; env?: NodeJS.ProcessEnv } = {}): MallocTrimmer {
  const minInterval = o.minIntervalMs ?? 1000;
  let trims = 0;
  if ((o.env ?? process.env).MESHCAP_AGENT_MALLOC_TRIM === '0') return { soon: () => undefined, get trims() { return trims; }, close: () => undefined };
  let last = -Infinity;
  let pending: NodeJS.Immediate | NodeJS.Timeout | undefined;
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
    get trims() {
      return trims;
    },
    close() {
      obs.disconnect();
      if (pending) {
        clearTimeout(pending as NodeJS.Timeout);
        clearImmediate(pending as NodeJS.Immediate);
      }
    },
  };
}
