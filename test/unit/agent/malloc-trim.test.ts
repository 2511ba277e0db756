// The agent's malloc trim (src/agent/malloc-trim.ts): glibc's malloc_trim(0)
// gives back free pages between live chunks of the brk heap, which its own
// trim (the top only) keeps; the trimmer runs it after a major GC, at most
// once per interval, and not at all with MESHCAP_AGENT_MALLOC_TRIM=0.
import { readFileSync } from 'node:fs';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { startMallocTrimmer } from '../../../src/agent/malloc-trim.js';
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

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

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
    const t = startMallocTrimmer({ minIntervalMs: 300 });
    try {
      gc(); // a major GC
      await sleep(50);
      expect(t.trims).toBe(1);
      gc();
      t.soon();
      await sleep(50);
      expect(t.trims).toBe(1); // within the interval: deferred, not dropped
      await sleep(400);
      expect(t.trims).toBe(2);
    } finally {
      t.close();
    }
    const off = startMallocTrimmer({ env: { MESHCAP_AGENT_MALLOC_TRIM: '0' } });
    gc();
    off.soon();
    await sleep(50);
    expect(off.trims).toBe(0);
    off.close();
  });
});
