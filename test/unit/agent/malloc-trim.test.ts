// The agent's malloc trim (src/agent/malloc-trim.ts): glibc's malloc_trim(0)
// gives back free pages between live chunks of the brk heap, which its own
// trim (the top only) keeps; the trimmer runs it after a major GC, at most
// once per interval, and not at all with MESHCAP_AGENT_MALLOC_TRIM=0;
// collect() (for the agent's start) is a full GC and the trim 100 ms later;
// over the soft limit it trims, then runs a full GC, backing off.
import { readFileSync } from 'node:fs';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { softLimitBytes, startMallocTrimmer } from '../../../src/agent/malloc-trim.js';
import { mallocTrim } from '../../../src/native/addon.js';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

/** Resident KiB of the brk heap ([heap] in smaps). */
function brkRssKiB(): number {
  const s = readFileSync('/proc/self/smaps', 'utf8');
  const at = s.indexOf('[heap]');
  if (at < 0) return 0;
  return Number(/Rss:\s+(\d+) kB/.exec(s.slice(at))![1]);
}

/** This worker's own RSS must not start the soft limit's trims and GCs in the tests that count them. */
const NO_LIMIT = { MESHCAP_AGENT_SOFT_LIMIT_MIB: '0' };

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** Waits for `ok` (polled every 10 ms), failing after 5 s. */
async function until(ok: () => boolean): Promise<void> {
  const t0 = performance.now();
  while (!ok()) {
    if (performance.now() - t0 > 5000) throw new Error('not within 5 s');
    await sleep(10);
  }
}

describe('malloc trim', () => {
  it('gives back the free pages between live chunks of the malloc heap', () => {
    // 48 KiB blocks (below glibc's mmap threshold: from the brk heap), every
    // other one kept: the freed ones cannot coalesce into the heap's top.
    const kept: Buffer[] = [];
    let freed: Buffer[] = [];
    for (let i = 0; i < 600; i++) {
      const b = Buffer.allocUnsafeSlow(48 << 10).fill(1); // touched: resident
      (i % 2 === 0 ? freed : kept).push(b);
    }
    freed = [];
    gc();
    gc();
    const before = brkRssKiB();
    expect(mallocTrim()).toBe(true);
    const after = brkRssKiB();
    // ~14 MiB was free in the middle of the heap
    expect(before - after).toBeGreaterThan(8 << 10);
    expect(kept.every((b) => b[100] === 1)).toBe(true); // the live ones untouched
  });

  it('trims after a major GC, at most once per interval; MESHCAP_AGENT_MALLOC_TRIM=0 turns it off', async () => {
    // an interval long beside the waits (a loaded machine delays timers and the GC observer)
    const t = startMallocTrimmer({ minIntervalMs: 1500, env: NO_LIMIT });
    try {
      gc(); // a major GC
      await until(() => t.trims === 1);
      const first = performance.now();
      gc();
      t.soon();
      await sleep(50);
      if (performance.now() - first < 1400) expect(t.trims).toBe(1); // within the interval: deferred, not dropped
      await until(() => t.trims === 2);
      expect(performance.now() - first).toBeGreaterThanOrEqual(1490);
    } finally {
      t.close();
    }
    const off = startMallocTrimmer({ env: { ...NO_LIMIT, MESHCAP_AGENT_MALLOC_TRIM: '0' } });
    gc();
    off.soon();
    expect(off.collect()).toBeUndefined();
    await sleep(50);
    expect(off.trims).toBe(0);
    expect(off.collections).toBe(0);
    off.close();
  });

  it('collect(): a full GC that frees what the start left, then the trim, once, whatever the interval', async () => {
    const t = startMallocTrimmer({ minIntervalMs: 60_000, env: NO_LIMIT });
    try {
      t.soon(); // the trim at ready
      await sleep(20);
      expect(t.trims).toBe(1);
      // garbage in the malloc heap (Buffers' backing stores) and in V8's heap;
      // every other block kept, so that what is freed lies between live
      // chunks, where only the trim gives it back (a GC V8 starts on its own
      // meanwhile frees it just the same)
      const kept: Buffer[] = [];
      let junk: unknown[] | undefined = [];
      for (let i = 0; i < 600; i++) {
        const b = Buffer.allocUnsafeSlow(48 << 10).fill(2);
        if (i % 2 === 0) kept.push(b);
        else junk.push(b, { i, s: `x${i}`.repeat(64) });
      }
      junk = undefined;
      const before = brkRssKiB();
      const ms = t.collect();
      expect(ms).toBeGreaterThan(0);
      expect(t.collections).toBe(1);
      // within the interval, yet trimmed once V8's background sweeping has
      // freed the dead buffers: what the GC freed is back
      await until(() => t.trims === 2);
      expect(before - brkRssKiB()).toBeGreaterThan(8 << 10);
      expect(kept.every((b) => b[7] === 2)).toBe(true);
      await sleep(200);
      expect(t.trims).toBe(2); // its own major GC does not ask for another
    } finally {
      t.close();
    }
    const noGc = startMallocTrimmer({ env: { ...NO_LIMIT, MESHCAP_AGENT_SETTLE_GC: '0' } });
    expect(noGc.collect()).toBeUndefined();
    expect(noGc.collections).toBe(0);
    noGc.close();
  });

  it('the soft limit: reads MESHCAP_AGENT_SOFT_LIMIT_MIB (90 MiB by default, 0 off), refuses anything else', () => {
    expect(softLimitBytes({})).toBe(90 * 1048576);
    expect(softLimitBytes({ MESHCAP_AGENT_SOFT_LIMIT_MIB: '' })).toBe(90 * 1048576);
    expect(softLimitBytes({ MESHCAP_AGENT_SOFT_LIMIT_MIB: '0' })).toBe(0);
    expect(softLimitBytes({ MESHCAP_AGENT_SOFT_LIMIT_MIB: '128' })).toBe(128 * 1048576);
    for (const bad of ['-1', '1.5', '90MiB', ' 90', '1e3']) {
      expect(() => softLimitBytes({ MESHCAP_AGENT_SOFT_LIMIT_MIB: bad })).toThrow(/MESHCAP_AGENT_SOFT_LIMIT_MIB must be a whole number of MiB/);
    }
    expect(() => startMallocTrimmer({ env: { MESHCAP_AGENT_SOFT_LIMIT_MIB: 'x' } })).toThrow(/soft limit off/);
  });

  it('the soft limit: over it, a trim and then a full GC, at most once a second, backing off while GCs cannot bring it under', async () => {
    let rss = 0;
    const overs: number[][] = [];
    const t = startMallocTrimmer({ env: { MESHCAP_AGENT_SOFT_LIMIT_MIB: '1' }, rss: () => rss, onOverLimit: (r, l) => overs.push([r, l]) });
    try {
      await sleep(600);
      expect(t.trims).toBe(0); // under the limit: nothing to do
      expect(t.limitGcs).toBe(0);
      rss = 2 * 1048576; // over, and no GC brings it under (a live set over the limit)
      await until(() => t.limitGcs === 1);
      const first = performance.now();
      expect(t.trims).toBeGreaterThanOrEqual(1); // the trim came first
      // still over after the GC: the next one waits 2 s, not 1
      await sleep(1300);
      if (performance.now() - first < 1900) expect(t.limitGcs).toBe(1);
      expect(overs).toEqual([[2 * 1048576, 1048576]]); // said once, when the backoff began
      const trimsMeanwhile = t.trims;
      expect(trimsMeanwhile).toBeGreaterThanOrEqual(3); // trims go on every 250 ms
      await until(() => t.limitGcs === 2);
      expect(performance.now() - first).toBeGreaterThanOrEqual(1990);
      rss = 0;
      await sleep(100);
      const trims = t.trims;
      await sleep(600);
      expect(t.trims).toBe(trims); // under again: the watch reads, nothing else
      expect(t.limitGcs).toBe(2);
      expect(overs).toHaveLength(1);
    } finally {
      t.close();
    }
  });
});

