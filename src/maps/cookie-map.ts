// A map read whole (bpf.mapEntries), looked up by the netns cookie in its
// keys without an object per entry: a pass over 10,000 pods held 20,000
// Buffer views (mc_pods, mc_stats) and a Set of hex strings per pod and map
// (mc_cidrs, mc_ports) for its whole length, ~10 MiB of heap the self-check
// took every 30 s (docs/bench-scale.md). Here the entries stay in the two
// Buffers mapEntries returned; their numbers are sorted by cookie (typed
// arrays), and a pod's value (a view) or key set is made when it is asked
// for, short-lived. Reads like a Map (get/has/set/delete, iteration); what
// set/delete change is kept beside the read entries.
import type { MapEntries } from '../native/addon.js';

const LO = 0xffffffffn;
/** The last cookie looked up, split into u32 halves (see span). */
const halves = { cookie: -1n, h: 0, l: 0 };

/**
 * Cookie -> V over one map's entries. `at`: where the u64 cookie sits in a
 * key. `make` builds a cookie's V from its entries' numbers (in read order).
 */
export class CookieMap<V> implements Iterable<[bigint, V]> {
  /** Entry numbers sorted by cookie (then by number: read order within a cookie). */
  private readonly order: Uint32Array;
  /** The cookie of order[i], halves (u32 compares, no BigInt per step). */
  private readonly hi: Uint32Array;
  private readonly lo: Uint32Array;
  /** set() and delete() after the read (undefined: deleted). */
  private readonly changed = new Map<bigint, V | undefined>();

  /** read: the map's entries; `make` keeps its Buffers (the views and keys it makes are of them). */
  constructor(read: MapEntries, at: number, private readonly make: (entries: number[]) => V) {
    const { count, keySize, keys } = read;
    const hi = new Uint32Array(count);
    const lo = new Uint32Array(count);
    for (let i = 0; i < count; i++) {
      lo[i] = keys.readUInt32LE(i * keySize + at);
      hi[i] = keys.readUInt32LE(i * keySize + at + 4);
    }
    const order = new Uint32Array(count);
    for (let i = 0; i < count; i++) order[i] = i;
    order.sort((a, b) => (hi[a]! - hi[b]!) || (lo[a]! - lo[b]!) || (a - b));
    this.order = order;
    this.hi = new Uint32Array(count);
    this.lo = new Uint32Array(count);
    for (let i = 0; i < count; i++) {
      this.hi[i] = hi[order[i]!]!;
      this.lo[i] = lo[order[i]!]!;
    }
  }

  /** [first, end) in `order` of the cookie's entries as read. */
  private span(cookie: bigint): [number, number] {
    // A pass asks several maps for one pod in a row: its halves are split once.
    if (cookie !== halves.cookie) {
      halves.cookie = cookie;
      halves.h = Number((cookie >> 32n) & LO);
      halves.l = Number(cookie & LO);
    }
    const { h, l } = halves;
    const hi = this.hi;
    const lo = this.lo;
    let a = 0;
    let b = this.order.length;
    while (a < b) {
      const m = (a + b) >>> 1;
      if (hi[m]! < h || (hi[m] === h && lo[m]! < l)) a = m + 1;
      else b = m;
    }
    let end = a;
    while (end < this.order.length && hi[end] === h && lo[end] === l) end++;
    return [a, end];
  }

  private read(cookie: bigint): V | undefined {
    const [a, b] = this.span(cookie);
    if (a === b) return undefined;
    return this.make(Array.from(this.order.subarray(a, b)));
  }

  get(cookie: bigint): V | undefined {
    return this.changed.has(cookie) ? this.changed.get(cookie) : this.read(cookie);
  }

  has(cookie: bigint): boolean {
    if (this.changed.has(cookie)) return this.changed.get(cookie) !== undefined;
    const [a, b] = this.span(cookie);
    return a < b;
  }

  set(cookie: bigint, v: V): this {
    this.changed.set(cookie, v);
    return this;
  }

  delete(cookie: bigint): boolean {
    const had = this.has(cookie);
    this.changed.set(cookie, undefined);
    return had;
  }

  /** The cookies read, in order, each once. */
  private *readCookies(): Generator<bigint> {
    for (let i = 0; i < this.order.length; i++) {
      if (i > 0 && this.hi[i] === this.hi[i - 1] && this.lo[i] === this.lo[i - 1]) continue;
      yield (BigInt(this.hi[i]!) << 32n) | BigInt(this.lo[i]!);
    }
  }

  *keys(): Generator<bigint> {
    for (const c of this.readCookies()) if (!this.changed.has(c)) yield c;
    for (const [c, v] of this.changed) if (v !== undefined) yield c;
  }

  *[Symbol.iterator](): Generator<[bigint, V]> {
    for (const c of this.keys()) yield [c, this.get(c)!];
  }

  get size(): number {
    let n = 0;
    for (const c of this.readCookies()) if (!this.changed.has(c)) n++;
    for (const v of this.changed.values()) if (v !== undefined) n++;
    return n;
  }
}

/** A u64-keyed map's values by cookie (one entry each: mc_pods, mc_stats), as views of the read Buffer. */
export function valuesByCookie(e: MapEntries): CookieMap<Buffer> {
  return new CookieMap(e, 0, (n) => e.values.subarray(n[0]! * e.valueSize, (n[0]! + 1) * e.valueSize));
}

/** A pod's keys (hex) by cookie, `at` the cookie's offset in the key (mc_cidrs, mc_ports, mc_portranges). */
export function hexKeysByCookie(e: MapEntries, at: number): CookieMap<Set<string>> {
  return new CookieMap(e, at, (n) => new Set(n.map((i) => e.keys.toString('hex', i * e.keySize, (i + 1) * e.keySize))));
}

/**
 * A pod's keys packed end to end in one latin1 string (one byte per char), by
 * cookie: PodMaps' index of what each pod has in a map, built from one read
 * of the map without a Buffer per key (at 10,000 pods the per-key Buffers of
 * a key walk made the first ADD after a start take ~250 ms and ~20 MiB).
 */
export function packedKeysByCookie(e: MapEntries, at: number): CookieMap<string> {
  let scratch = Buffer.alloc(0);
  return new CookieMap(e, at, (n) => {
    const len = n.length * e.keySize;
    if (scratch.length < len) scratch = Buffer.allocUnsafe(Math.max(len, 256));
    n.forEach((i, k) => e.keys.copy(scratch, k * e.keySize, i * e.keySize, (i + 1) * e.keySize));
    return scratch.toString('latin1', 0, len);
  });
}
