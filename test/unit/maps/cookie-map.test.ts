// CookieMap reads like the Map of Sets/views the snapshot built before (a
// reference Map built from the same entries here), for cookies of any u64
// value, keys holding the cookie at an offset, and after set/delete.
import { describe, expect, it } from 'vitest';
import { hexKeysByCookie, packedKeysByCookie, valuesByCookie } from '../../../src/maps/cookie-map.js';
import type { MapEntries } from '../../../src/native/addon.js';

/** Entries as mapEntries returns them: keys of keySize with the cookie at `at`, values of valueSize. */
function entries(rows: { cookie: bigint; tag: number }[], keySize: number, at: number, valueSize = 4): MapEntries {
  const keys = Buffer.alloc(rows.length * keySize);
  const values = Buffer.alloc(rows.length * valueSize);
  rows.forEach((r, i) => {
    keys.writeBigUInt64LE(r.cookie, i * keySize + at);
    // a tag beside the cookie, where the key has room (a u64 key has none)
    if (at >= 2) keys.writeUInt16LE(r.tag, i * keySize);
    else if (keySize >= 10) keys.writeUInt16LE(r.tag, i * keySize + 8);
    values.writeUInt32LE(r.tag, i * valueSize);
  });
  return { count: rows.length, keySize, valueSize, keys, values, batched: true };
}

// cookies across both 32-bit halves, in no order, one of them with several keys
const COOKIES = [7n, 0x1_0000_0002n, 3n, 0xffff_ffff_ffff_fff0n, 0x2_0000_0000n, 0xffff_ffffn];

describe('CookieMap', () => {
  it('values by cookie: get, has, size and iteration as a Map of the same entries', () => {
    const e = entries(COOKIES.map((cookie, i) => ({ cookie, tag: i + 1 })), 8, 0);
    const m = valuesByCookie(e);
    const ref = new Map(COOKIES.map((c, i) => [c, e.values.subarray(i * 4, i * 4 + 4)]));
    expect(m.size).toBe(ref.size);
    for (const [c, v] of ref) {
      expect(m.has(c)).toBe(true);
      expect(m.get(c)!.equals(v)).toBe(true);
    }
    for (const absent of [0n, 4n, 0x1_0000_0003n, 0xffff_ffff_ffff_ffffn, 0x1_ffff_ffffn]) {
      expect(m.has(absent)).toBe(false);
      expect(m.get(absent)).toBeUndefined();
    }
    expect([...m.keys()].sort((a, b) => (a < b ? -1 : 1))).toEqual([...ref.keys()].sort((a, b) => (a < b ? -1 : 1)));
    expect(new Map([...m].map(([c, v]) => [c, v.toString('hex')]))).toEqual(new Map([...ref].map(([c, v]) => [c, v.toString('hex')])));
  });

  it('set and delete after the read change what get, has, size and iteration show, as on a Map', () => {
    const m = valuesByCookie(entries(COOKIES.map((cookie, i) => ({ cookie, tag: i + 1 })), 8, 0));
    const v = Buffer.from('abcd');
    m.set(3n, v);
    expect(m.get(3n)).toBe(v);
    expect(m.size).toBe(COOKIES.length);
    expect(m.delete(7n)).toBe(true);
    expect(m.delete(7n)).toBe(false);
    expect(m.has(7n)).toBe(false);
    expect(m.get(7n)).toBeUndefined();
    m.set(99n, v);
    expect(m.size).toBe(COOKIES.length);
    expect(m.has(99n)).toBe(true);
    expect(new Set(m.keys())).toEqual(new Set([...COOKIES.filter((c) => c !== 7n), 99n]));
    m.set(7n, v);
    expect(m.get(7n)).toBe(v);
    expect(m.size).toBe(COOKIES.length + 1);
  });

  it('keys by cookie at an offset: each pod\'s set of hex keys, none of another pod\'s', () => {
    const rows = [...COOKIES.map((cookie, i) => ({ cookie, tag: i + 1 })), { cookie: 3n, tag: 100 }, { cookie: 3n, tag: 101 }, { cookie: 0x1_0000_0002n, tag: 102 }];
    const e = entries(rows, 12, 4);
    const m = hexKeysByCookie(e, 4);
    const ref = new Map<bigint, Set<string>>();
    rows.forEach((r, i) => {
      const hex = e.keys.toString('hex', i * 12, (i + 1) * 12);
      ref.set(r.cookie, (ref.get(r.cookie) ?? new Set()).add(hex));
    });
    expect(m.size).toBe(ref.size);
    for (const [c, keys] of ref) expect(m.get(c)).toEqual(keys);
    expect(m.get(3n)!.size).toBe(3);
    expect(m.get(5n)).toBeUndefined();
    expect(new Map(m)).toEqual(ref);
    m.set(3n, new Set(['00']));
    expect(m.get(3n)).toEqual(new Set(['00']));
  });

  it('an empty map', () => {
    const m = hexKeysByCookie(entries([], 12, 4), 4);
    expect(m.size).toBe(0);
    expect(m.get(1n)).toBeUndefined();
    expect([...m]).toEqual([]);
  });
  it('packed keys by cookie: each pod\'s keys end to end in read order, as packing its key Buffers would', () => {
    // 24-byte keys with the cookie at 8, several keys for some pods, interleaved
    const rows = [...COOKIES, 3n, 7n, 3n, 0xffff_ffffn].map((cookie, i) => ({ cookie, tag: i + 1 }));
    const e = entries(rows, 24, 8);
    const ref = new Map<bigint, Buffer[]>();
    rows.forEach((r, i) => ref.set(r.cookie, [...(ref.get(r.cookie) ?? []), e.keys.subarray(i * 24, (i + 1) * 24)]));
    const m = new Map(packedKeysByCookie(e, 8));
    expect(m.size).toBe(ref.size);
    for (const [c, keys] of ref) expect(Buffer.from(m.get(c)!, 'latin1').equals(Buffer.concat(keys)), `cookie ${c}`).toBe(true);
    // a pod with more keys than the last one's does not see that one's bytes (the scratch buffer is reused)
    expect(m.get(3n)!.length).toBe(3 * 24);
    expect(m.get(0x2_0000_0000n)!.length).toBe(24);
  });
});
