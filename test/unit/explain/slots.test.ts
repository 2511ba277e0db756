// The destination-slot arithmetic meshcap explain shares with
// bpf/outbound.bpf.c (mc_slot_hash4, mc_slot_of4) and the choice connect4
// makes among the candidates (mc_slot_claim4), against a map reader.
import { describe, expect, it } from 'vitest';
import { slotAddress, slotCandidates4, slotFor4, spreadLoopback4, type PodMapReader } from '../../../src/explain/kernel-verdict.js';
import type { McSlot } from '../../../src/maps/layout.js';

const ip = (a: string) => Buffer.from(a.split('.').map(Number));

/** The hash before slots (mc_spread_addr4 of 2026-11-24), written out again: probe 0 must be it. */
function spreadBefore(addr: Buffer, port: number): number {
  let x = (addr.readUInt32BE(0) ^ ((port << 16) | port)) >>> 0;
  x = Math.imul(x, 0x9e3779b1) >>> 0;
  x = (x ^ (x >>> 15)) >>> 0;
  x = Math.imul(x, 0x85ebca77) >>> 0;
  x = (x ^ (x >>> 13)) >>> 0;
  return x & 0xffffff;
}

function reader(slots: Map<number, McSlot>): PodMapReader {
  return {
    pod: () => null,
    portIn: () => false,
    cidrMatch: () => false,
    hasListener: () => true,
    slot: (_netns, s) => slots.get(s) ?? null,
  };
}

describe('destination slots', () => {
  it('probe 0 is the address the version before slots picked; the candidates are distinct and never reserved', () => {
    for (let i = 0; i < 2000; i++) {
      const a = Buffer.from([198, 18, (i >> 8) & 255, i & 255]);
      const port = 80 + (i % 7) * 1000;
      const c = slotCandidates4(a, port);
      const before = spreadBefore(a, port);
      if (![0, 1, 6, 0xffffff].includes(before)) expect(c[0]).toBe(before);
      expect(c.length).toBeGreaterThanOrEqual(3);
      expect(new Set(c).size).toBe(c.length);
      for (const s of c) {
        expect(s).toBeGreaterThan(0);
        expect([1, 6, 0xffffff]).not.toContain(s);
        expect(s).toBeLessThanOrEqual(0xffffff);
      }
    }
    expect(spreadLoopback4(ip('198.18.1.2'), 80)).toBe(slotAddress(slotCandidates4(ip('198.18.1.2'), 80)[0]!));
    expect(slotAddress(0x123456)).toBe('127.18.52.86');
  });

  it('the slot that names the destination, else the first free candidate, else 127.0.0.1', () => {
    const d = ip('198.18.1.2');
    const c = slotCandidates4(d, 80);
    const mine: McSlot = { addr: d, port: 80, to: 15001 };
    const other: McSlot = { addr: ip('198.18.9.9'), port: 80, to: 15001 };
    expect(slotFor4(reader(new Map()), 1n, d, 80, 15001)).toEqual({ address: slotAddress(c[0]!), slot: 'free' });
    expect(slotFor4(reader(new Map([[c[0]!, other]])), 1n, d, 80, 15001)).toEqual({ address: slotAddress(c[1]!), slot: 'free' });
    expect(slotFor4(reader(new Map([[c[0]!, other], [c[1]!, mine]])), 1n, d, 80, 15001)).toEqual({ address: slotAddress(c[1]!), slot: 'has' });
    // a slot made for another outbound port does not name it
    expect(slotFor4(reader(new Map([[c[0]!, { ...mine, to: 15002 }]])), 1n, d, 80, 15001).slot).toBe('free');
    expect(slotFor4(reader(new Map(c.map((s) => [s, other]))), 1n, d, 80, 15001)).toEqual({ address: '127.0.0.1', slot: 'none' });
  });
});
