// The pass's view of mc_listen (listener-index.ts): built from keys packed as
// the kernel returns them, any slot of a listener counts, nothing else does.
import { describe, expect, it } from 'vitest';
import { mcListenKey } from '../../../src/maps/layout.js';
import { ListenerIndex } from '../../../src/pod-datapath/listener-index.js';

const key = (netns: bigint, port: number, family: 4 | 6, slot = 0) => mcListenKey.encode({ netns, port, family, slot, pad: Buffer.alloc(4) });
const packed = (keys: Buffer[]) => Buffer.concat(keys);

describe('ListenerIndex', () => {
  it('holds each (pod, port, family) of the keys, whatever slot, and nothing else', () => {
    const ix = new ListenerIndex().load(packed([key(7n, 15006, 4, 2), key(7n, 15006, 4, 0), key(7n, 15001, 4, 1), key(0x1_0000_0007n, 15006, 6, 3)]));
    expect(ix.size).toBe(3);
    expect(ix.has(7n, 15006, 4)).toBe(true);
    expect(ix.has(7n, 15001, 4)).toBe(true);
    expect(ix.has(0x1_0000_0007n, 15006, 6)).toBe(true);
    // the same words in other places: another family, port, cookie half
    expect(ix.has(7n, 15006, 6)).toBe(false);
    expect(ix.has(7n, 15007, 4)).toBe(false);
    expect(ix.has(0x1_0000_0007n, 15006, 4)).toBe(false);
    expect(ix.has(0x1_0000_0000n, 15006, 6)).toBe(false);
    expect(ix.has(0x7_0000_0001n, 15006, 4)).toBe(false);
    expect(new ListenerIndex().has(7n, 15006, 4)).toBe(false);
  });

  it('60,000 keys of 10,000 two-worker pods: every listener found, none invented', () => {
    const keys: Buffer[] = [];
    const cookie = (i: number) => 0x2000_0000_0000n + BigInt(i) * 4099n;
    for (let i = 0; i < 10_000; i++) {
      for (const [port, family] of [[15006, 4], [15006, 6], [15001, 4]] as const) for (const slot of [0, 1]) keys.push(key(cookie(i), port, family, slot));
    }
    // the kernel returns keys in hash order
    for (let i = keys.length - 1; i > 0; i--) {
      const j = (i * 7919) % (i + 1);
      [keys[i], keys[j]] = [keys[j]!, keys[i]!];
    }
    const ix = new ListenerIndex().load(packed(keys));
    expect(ix.size).toBe(30_000);
    let found = 0;
    let invented = 0;
    for (let i = 0; i < 10_000; i++) {
      if (ix.has(cookie(i), 15006, 4) && ix.has(cookie(i), 15006, 6) && ix.has(cookie(i), 15001, 4)) found++;
      if (ix.has(cookie(i), 15001, 6) || ix.has(cookie(i) + 1n, 15006, 4)) invented++;
    }
    expect(found).toBe(10_000);
    expect(invented).toBe(0);
  });

  it('a reload forgets what is gone, and a torn buffer is refused', () => {
    const ix = new ListenerIndex().load(packed([key(1n, 15006, 4), key(2n, 15006, 4)]));
    ix.load(packed([key(2n, 15006, 4)]));
    expect(ix.has(1n, 15006, 4)).toBe(false);
    expect(ix.has(2n, 15006, 4)).toBe(true);
    ix.load(Buffer.alloc(0));
    expect(ix.size).toBe(0);
    expect(ix.has(2n, 15006, 4)).toBe(false);
    expect(() => ix.load(Buffer.alloc(mcListenKey.size + 3))).toThrow(/not whole keys of 16 bytes/);
  });
});
