// Which (pod, port, family) mc_listen holds, any slot, read from its keys
// packed in one Buffer: an open-addressing table on a typed array. A
// self-check pass asks it for every pod; at 10,000 pods whose two-worker
// proxies listen on both families mc_listen has 60,000 keys, and a Set of
// one string per (pod, port, family), with a key Buffer and a string per
// question, allocated ~16 MiB of V8 heap in each pass right after its full
// GC and kept ~1.5 MiB (docs/bench-scale.md). The table is off the V8 heap
// (1.5 MiB at 60,000 keys) and made per load, so it is unmapped between
// passes (the DaemonSet's MALLOC_MMAP_THRESHOLD_ puts it in its own mapping).
import { mcListenKey } from '../maps/layout.js';

const PORT_AT = mcListenKey.fields.find((f) => f.name === 'port')!.offset;
const FAMILY_AT = mcListenKey.fields.find((f) => f.name === 'family')!.offset;
const SCRATCH = Buffer.alloc(8);

/** 32-bit mix of the three words (murmur3's finalizer over a simple combine). */
function hash(lo: number, hi: number, tag: number): number {
  let h = Math.imul(lo ^ Math.imul(hi, 0x9e3779b1), 0x85ebca6b) ^ tag;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

export class ListenerIndex {
  /** slot i: words[3i] cookie low, [3i+1] cookie high, [3i+2] port << 8 | family (0: empty; a listener's port is never 0) */
  private words = new Uint32Array(0);
  private mask = -1;
  private count = 0;

  /** How many (pod, port, family) it holds. */
  get size(): number {
    return this.count;
  }

  /** Fills it from mc_listen's keys packed back to back (bpf.mapKeysPacked), dropping what it held. */
  load(packed: Buffer): this {
    const keySize = mcListenKey.size;
    if (packed.length % keySize !== 0) throw new Error(`mc_listen keys: ${packed.length} bytes are not whole keys of ${keySize} bytes`);
    const keys = packed.length / keySize;
    let slots = 16;
    while (slots < keys * 2) slots *= 2;
    // at most half full even if no two keys are slots of one listener, so a probe always ends
    this.words = new Uint32Array(slots * 3);
    this.mask = slots - 1;
    this.count = 0;
    for (let at = 0; at < packed.length; at += keySize) {
      const lo = packed.readUInt32LE(at);
      const hi = packed.readUInt32LE(at + 4);
      const tag = ((packed.readUInt16LE(at + PORT_AT) << 8) | packed[at + FAMILY_AT]!) >>> 0;
      if (tag === 0) continue;
      this.insert(lo, hi, tag);
    }
    return this;
  }

  private insert(lo: number, hi: number, tag: number): void {
    const w = this.words;
    for (let i = hash(lo, hi, tag) & this.mask; ; i = (i + 1) & this.mask) {
      const t = w[i * 3 + 2]!;
      if (t === 0) {
        w[i * 3] = lo;
        w[i * 3 + 1] = hi;
        w[i * 3 + 2] = tag;
        this.count++;
        return;
      }
      if (t === tag && w[i * 3] === lo && w[i * 3 + 1] === hi) return; // another slot of the same listener
    }
  }

  /** Does mc_listen hold a socket of this pod (netns cookie) on this port and family, in any slot? */
  has(netns: bigint, port: number, family: 4 | 6): boolean {
    if (this.count === 0) return false;
    SCRATCH.writeBigUInt64LE(netns);
    const lo = SCRATCH.readUInt32LE(0);
    const hi = SCRATCH.readUInt32LE(4);
    const tag = ((port << 8) | family) >>> 0;
    const w = this.words;
    for (let i = hash(lo, hi, tag) & this.mask; ; i = (i + 1) & this.mask) {
      const t = w[i * 3 + 2]!;
      if (t === 0) return false;
      if (t === tag && w[i * 3] === lo && w[i * 3 + 1] === hi) return true;
    }
  }
}
