// The matrix table itself: what issue 7 asks of it, so an edit cannot quietly
// drop the forced-iptables run or the kernel where the probe must refuse eBPF.
import { describe, expect, it } from 'vitest';
import { MATRIX, selectKernels } from './matrix.mjs';

describe('kernel matrix', () => {
  it('covers 5.10, 6.1 and 6.12 with the mode the probe must choose', () => {
    expect(MATRIX.map((k) => [k.id, k.expectedMode])).toEqual([['5.10', 'iptables'], ['6.1', 'ebpf'], ['6.12', 'ebpf']]);
  });

  it('forces iptables mode on at least one kernel, and only where the probe would pick eBPF', () => {
    const forced = MATRIX.filter((k) => k.forceIptables);
    expect(forced.length).toBeGreaterThan(0);
    for (const k of forced) expect(k.expectedMode, k.id).toBe('ebpf');
  });

  it('selects a subset by id and names the known ids for an unknown one', () => {
    expect(selectKernels(['6.12', '5.10']).map((k) => k.id)).toEqual(['6.12', '5.10']);
    expect(selectKernels(undefined)).toBe(MATRIX);
    expect(() => selectKernels(['4.19'])).toThrow("unknown kernel '4.19': the matrix has 5.10, 6.1, 6.12");
  });
});
