// Map element operations on real kernel maps (hash, LPM trie, per-CPU array).
import os from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import * as bpf from '../../../src/native/addon.js';
import { NativeError } from '../../../src/native/errors.js';
import { kernelAtLeast, parseKernelRelease } from '../../../src/loader/kernel.js';
import { compileFixture, removeDir, tempDir, u32, u64 } from './kernel-env.js';

let work: string;
let obj: bpf.BpfObject | undefined;
let hashFd: number;
let lpmFd: number;
let percpuFd: number;
let progFd: number;

beforeAll(async () => {
  work = tempDir();
  obj = bpf.openObject(await compileFixture(work, 'maps'));
  await obj.load();
  const fd = (name: string) => obj!.maps().find((m) => m.name === name)!.fd;
  hashFd = fd('hash');
  lpmFd = fd('cidrs');
  percpuFd = fd('percpu');
  progFd = obj.programs()[0]!.fd;
});
afterAll(() => {
  obj?.close();
  removeDir(work);
});

// LPM key: u32 prefixlen (host order) + 4 address bytes (network order).
const lpmKey = (prefixlen: number, addr: string): Buffer => {
  const b = Buffer.alloc(8);
  b.writeUInt32LE(prefixlen);
  Buffer.from(addr.split('.').map(Number)).copy(b, 4);
  return b;
};

function clear(fd: number, keySize: number): void {
  for (const k of bpf.mapKeys(fd, keySize)) bpf.mapDelete(fd, k);
}

describe('hash map', () => {
  it('update / lookup / delete / keys round trip', () => {
    clear(hashFd, 4);
    expect(bpf.mapLookup(hashFd, u32(1), 8)).toBeNull();
    bpf.mapUpdate(hashFd, u32(1), u64(11));
    bpf.mapUpdate(hashFd, u32(2), u64(22));
    expect(bpf.mapLookup(hashFd, u32(1), 8)).toEqual(u64(11));
    expect(bpf.mapKeys(hashFd, 4).map((k) => k.readUInt32LE()).sort()).toEqual([1, 2]);
    expect(bpf.mapDelete(hashFd, u32(1))).toBe(true);
    expect(bpf.mapDelete(hashFd, u32(1))).toBe(false);
    expect(bpf.mapLookup(hashFd, u32(1), 8)).toBeNull();
    expect(bpf.mapKeys(hashFd, 4).map((k) => k.readUInt32LE())).toEqual([2]);
  });

  it('honours BPF_NOEXIST / BPF_EXIST with errno-named NativeErrors', () => {
    clear(hashFd, 4);
    bpf.mapUpdate(hashFd, u32(5), u64(1), bpf.consts.BPF_NOEXIST);
    expect(() => bpf.mapUpdate(hashFd, u32(5), u64(2), bpf.consts.BPF_NOEXIST)).toThrow(
      expect.objectContaining({ code: 'EEXIST', syscall: 'bpf_map_update_elem', object: `map fd ${hashFd}` }),
    );
    bpf.mapUpdate(hashFd, u32(5), u64(3), bpf.consts.BPF_EXIST);
    expect(bpf.mapLookup(hashFd, u32(5), 8)).toEqual(u64(3));
    let err: unknown;
    try {
      bpf.mapUpdate(hashFd, u32(6), u64(3), bpf.consts.BPF_EXIST);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(NativeError);
    expect((err as NativeError).code).toBe('ENOENT');
  });

  it('batch update and batch delete (with absent keys counted out)', () => {
    clear(hashFd, 4);
    const keys = Array.from({ length: 100 }, (_, i) => u32(1000 + i));
    const values = keys.map((_, i) => u64(i * 3));
    bpf.mapUpdateBatch(hashFd, keys, values);
    expect(bpf.mapKeys(hashFd, 4)).toHaveLength(100);
    expect(bpf.mapLookup(hashFd, u32(1042), 8)).toEqual(u64(126));
    // 50 present keys with 3 absent ones interleaved
    const del = [u32(5), ...keys.slice(0, 25), u32(6), ...keys.slice(25, 50), u32(7)];
    expect(bpf.mapDeleteBatch(hashFd, del)).toBe(50);
    expect(bpf.mapKeys(hashFd, 4)).toHaveLength(50);
    // the same walk packed in one Buffer: the same keys, 4 bytes each, end to end
    const packed = bpf.mapKeysPacked(hashFd, 4);
    expect(packed).toHaveLength(50 * 4);
    const unpacked = Array.from({ length: 50 }, (_, i) => packed.readUInt32LE(i * 4)).sort((x, y) => x - y);
    expect(unpacked).toEqual(bpf.mapKeys(hashFd, 4).map((k) => k.readUInt32LE()).sort((x, y) => x - y));
    expect(bpf.mapLookup(hashFd, u32(1000), 8)).toBeNull();
    expect(bpf.mapDeleteBatch(hashFd, [])).toBe(0);
    bpf.mapUpdateBatch(hashFd, [], []);
  });

  it('mapUpdateEach writes in order and stops at the first entry the kernel refuses, returning how many it wrote', () => {
    clear(hashFd, 4);
    expect(bpf.mapUpdateEach(hashFd, [u32(1), u32(2), u32(3)], [u64(1), u64(2), u64(3)])).toBe(3);
    expect(bpf.mapLookup(hashFd, u32(3), 8)).toEqual(u64(3));
    // BPF_NOEXIST: 4 goes in, 2 exists (EEXIST), so 5 after it is not tried
    expect(bpf.mapUpdateEach(hashFd, [u32(4), u32(2), u32(5)], [u64(4), u64(20), u64(5)], bpf.consts.BPF_NOEXIST)).toBe(1);
    expect(bpf.mapLookup(hashFd, u32(4), 8)).toEqual(u64(4));
    expect(bpf.mapLookup(hashFd, u32(2), 8)).toEqual(u64(2));
    expect(bpf.mapLookup(hashFd, u32(5), 8)).toBeNull();
    expect(bpf.mapUpdateEach(hashFd, [], [])).toBe(0);
    expect(() => bpf.mapUpdateEach(hashFd, [u32(1)], [u64(1), u64(2)])).toThrow(/1 keys but 2 values/);
    expect(() => bpf.mapUpdateEach(hashFd, [u32(1), u32(2)], [u64(1), Buffer.alloc(4)])).toThrow(/values\[1\] is 4 bytes/);
    expect(() => bpf.mapUpdateEach(progFd, [u32(1)], [u64(1)])).toThrow(/is not a bpf-map \(it is anon_inode:bpf-prog\)/);
    // an LPM trie (no batch ops) takes the same call
    clear(lpmFd, 8);
    expect(bpf.mapUpdateEach(lpmFd, [lpmKey(8, '198.0.0.0'), lpmKey(24, '198.18.7.0')], [u32(8), u32(24)])).toBe(2);
    expect(bpf.mapLookup(lpmFd, lpmKey(32, '198.18.7.9'), 4)).toEqual(u32(24));
    clear(lpmFd, 8);
  });

  it('mapEntries: every entry by batch lookup, in chunks, and by the key walk, alike', () => {
    clear(hashFd, 4);
    expect(bpf.mapEntries(hashFd)).toMatchObject({ count: 0, keySize: 4, valueSize: 8, batched: true });
    const n = 200;
    bpf.mapUpdateBatch(hashFd, Array.from({ length: n }, (_, i) => u32(i)), Array.from({ length: n }, (_, i) => u64(i * 7)));
    const asMap = (e: bpf.MapEntries) => {
      const m = new Map<number, bigint>();
      for (let i = 0; i < e.count; i++) m.set(e.keys.readUInt32LE(i * 4), e.values.readBigUInt64LE(i * 8));
      return m;
    };
    const want = new Map(Array.from({ length: n }, (_, i) => [i, BigInt(i * 7)]));
    const whole = bpf.mapEntries(hashFd);
    expect(whole.batched).toBe(true);
    expect(whole.keys.length).toBe(n * 4);
    expect(asMap(whole)).toEqual(want);
    // small chunks: resumed from the kernel's token; chunk 1 meets buckets of 2+ (ENOSPC, grown)
    for (const chunk of [7, 1]) {
      const e = bpf.mapEntries(hashFd, { chunk });
      expect(e.batched).toBe(true);
      expect(e.count).toBe(n);
      expect(asMap(e)).toEqual(want);
    }
    const walked = bpf.mapEntries(hashFd, { noBatch: true });
    expect(walked.batched).toBe(false);
    expect(asMap(walked)).toEqual(want);
    expect(() => bpf.mapEntries(hashFd, { chunk: 0 })).toThrow(/opts.chunk must be 1..65536/);
    expect(() => bpf.mapEntries(progFd)).toThrow(/is not a bpf-map/);
  });

  it('rejects Buffers whose size does not match the map with a TypeError', () => {
    expect(() => bpf.mapUpdate(hashFd, Buffer.alloc(8), u64(1))).toThrow(/key is 8 bytes, the map's key size is 4/);
    expect(() => bpf.mapUpdate(hashFd, u32(1), u32(1))).toThrow(TypeError);
    expect(() => bpf.mapLookup(hashFd, u32(1), 4)).toThrow(/valueSize is 4, the map's value size is 8/);
    expect(() => bpf.mapKeys(hashFd, 8)).toThrow(TypeError);
    expect(() => bpf.mapKeysPacked(hashFd, 8)).toThrow(/mapKeysPacked: keySize is 8, the map's key size is 4/);
    expect(() => bpf.mapUpdateBatch(hashFd, [u32(1)], [u64(1), u64(2)])).toThrow(/1 keys but 2 values/);
    expect(() => bpf.mapUpdateBatch(hashFd, [u32(1), Buffer.alloc(3)], [u64(1), u64(2)])).toThrow(/keys\[1\] is 3 bytes/);
    expect(() => bpf.mapLookup(progFd, u32(1), 8)).toThrow(/is not a bpf-map \(it is anon_inode:bpf-prog\)/);
  });
});

describe('LPM trie', () => {
  it('longest-prefix lookups, keys walk, batch ops falling back to single ops', () => {
    clear(lpmFd, 8);
    // LPM tries have no batch ops: mapUpdateBatch must fall back transparently.
    bpf.mapUpdateBatch(lpmFd, [lpmKey(8, '198.0.0.0'), lpmKey(15, '198.18.0.0'), lpmKey(24, '198.18.7.0')], [u32(8), u32(15), u32(24)]);
    expect(bpf.mapLookup(lpmFd, lpmKey(32, '198.18.7.9'), 4)).toEqual(u32(24));
    expect(bpf.mapLookup(lpmFd, lpmKey(32, '198.19.1.1'), 4)).toEqual(u32(15));
    expect(bpf.mapLookup(lpmFd, lpmKey(32, '198.200.1.1'), 4)).toEqual(u32(8));
    expect(bpf.mapLookup(lpmFd, lpmKey(32, '10.0.0.1'), 4)).toBeNull();
    const keys = bpf.mapKeys(lpmFd, 8).map((k) => k.toString('hex')).sort();
    expect(keys).toEqual([lpmKey(8, '198.0.0.0'), lpmKey(15, '198.18.0.0'), lpmKey(24, '198.18.7.0')].map((k) => k.toString('hex')).sort());
    expect(bpf.mapDelete(lpmFd, lpmKey(24, '198.18.7.0'))).toBe(true);
    expect(bpf.mapLookup(lpmFd, lpmKey(32, '198.18.7.9'), 4)).toEqual(u32(15));
    // batch lookup where this kernel has it for tries (6.x), the key walk else; the same entries
    const entries = (e: bpf.MapEntries) => Array.from({ length: e.count }, (_, i) => `${e.keys.subarray(i * 8, i * 8 + 8).toString('hex')}=${e.values.readUInt32LE(i * 4)}`).sort();
    const want = [`${lpmKey(8, '198.0.0.0').toString('hex')}=8`, `${lpmKey(15, '198.18.0.0').toString('hex')}=15`].sort();
    expect(entries(bpf.mapEntries(lpmFd))).toEqual(want);
    const walked = bpf.mapEntries(lpmFd, { noBatch: true });
    expect(walked.batched).toBe(false);
    expect(entries(walked)).toEqual(want);
    expect(bpf.mapDeleteBatch(lpmFd, [lpmKey(8, '198.0.0.0'), lpmKey(24, '198.18.7.0'), lpmKey(15, '198.18.0.0')])).toBe(2);
    expect(bpf.mapKeys(lpmFd, 8)).toEqual([]);
  });
});

describe('map without batch lookup (sockhash)', () => {
  it('mapEntries falls back to the key walk instead of failing', () => {
    const fd = obj!.maps().find((m) => m.name === 'sockets')!.fd;
    expect(bpf.mapEntries(fd)).toMatchObject({ count: 0, batched: false });
  });
});

describe('per-CPU array', () => {
  it('uses one 8-byte-aligned slot per possible CPU', () => {
    const slots = possibleCpus();
    const size = 8 * slots;
    const v = Buffer.alloc(size);
    for (let i = 0; i < slots; i++) v.writeUInt32LE(100 + i, i * 8);
    bpf.mapUpdate(percpuFd, u32(2), v);
    expect(bpf.mapLookup(percpuFd, u32(2), size)).toEqual(v);
    expect(() => bpf.mapLookup(percpuFd, u32(2), 4)).toThrow(new RegExp(`value size is ${size}`));
    // every slot of every CPU comes back, batched where the kernel batches
    // arrays (6.1 and later here; Debian's 5.10 does not: the key walk)
    const e = bpf.mapEntries(percpuFd);
    expect(e).toMatchObject({ count: 4, valueSize: size });
    if (kernelAtLeast(parseKernelRelease(os.release()), 6, 1)) expect(e.batched).toBe(true);
    const at = Array.from({ length: 4 }, (_, i) => e.keys.readUInt32LE(i * 4)).indexOf(2);
    expect(e.values.subarray(at * size, (at + 1) * size)).toEqual(v);

  });
});

function possibleCpus(): number {
  // /sys/devices/system/cpu/possible: "0-1" or "0,2-3"
  const text = readFileSync('/sys/devices/system/cpu/possible', 'utf8').trim();
  let n = 0;
  for (const part of text.split(',')) {
    const [a, b] = part.split('-').map(Number);
    n += b === undefined ? 1 : b - a! + 1;
  }
  return n;
}
