// The destination-slot arithmetic meshcap explain shares with
// bpf/outbound.bpf.c (mc_slot_hash4, mc_slot_of4) and the choice connect4
// makes among the candidates (mc_slot_claim4), against a map reader; the
// same for IPv6 slots (mc_slot_hash6, mc_slot_claim6) and the threshold.
import { describe, expect, it } from 'vitest';
import { slotAddress, slotAddress6, slotCandidates4, slotCandidates6, slotFor4, slotFor6, spreadLoopback4, type PodMapReader } from '../../../src/explain/kernel-verdict.js';
import type { McSlot, McSlot6 } from '../../../src/maps/layout.js';
import { v6SpillAt } from '../../../src/pod-netns.js';

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

describe('IPv6 destination slots', () => {
  const v6 = (last: number) => {
    const b = Buffer.alloc(16);
    b.writeUInt32BE(0x20010db8, 0);
    b.writeUInt32BE(last, 12);
    return b;
  };
  const reader6 = (slots: Map<number, McSlot6>): PodMapReader => ({ ...reader(new Map()), slot6: (_n, s) => slots.get(s) ?? null });

  it('four distinct candidates, never 0, and 100::S as the kernel prints it', () => {
    for (let i = 0; i < 2000; i++) {
      const c = slotCandidates6(v6(i), 80 + (i % 7) * 1000);
      expect(c.length).toBe(4);
      expect(new Set(c).size).toBe(4);
      for (const s of c) expect(s >>> 0).toBeGreaterThan(0);
    }
    expect(slotAddress6(0x12345678)).toBe('100::1234:5678');
    expect(slotAddress6(0x5678)).toBe('100::5678');
    expect(slotAddress6(0xffff0000)).toBe('100::ffff:0');
  });

  it('the slot that names the destination, else the first free candidate, else ::1', () => {
    const d = v6(2);
    const c = slotCandidates6(d, 80);
    const mine: McSlot6 = { addr: d, port: 80, to: 15001 };
    const other: McSlot6 = { addr: v6(9), port: 80, to: 15001 };
    expect(slotFor6(reader6(new Map()), 1n, d, 80, 15001)).toEqual({ address: slotAddress6(c[0]!), slot: 'free' });
    expect(slotFor6(reader6(new Map([[c[0]!, other], [c[1]!, mine]])), 1n, d, 80, 15001)).toEqual({ address: slotAddress6(c[1]!), slot: 'has' });
    expect(slotFor6(reader6(new Map([[c[0]!, { ...mine, to: 15002 }]])), 1n, d, 80, 15001).slot).toBe('free');
    expect(slotFor6(reader6(new Map(c.map((s) => [s, other]))), 1n, d, 80, 15001)).toEqual({ address: '::1', slot: 'none' });
  });

  it('a pod spills past half its ephemeral range', () => {
    expect(v6SpillAt([32768, 60999])).toBe(14116);
    expect(v6SpillAt([41000, 41063])).toBe(32);
    expect(v6SpillAt([5000, 5000])).toBe(1);
  });
});
