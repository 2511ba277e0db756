import { describe, expect, it } from 'vitest';
import { withoutTaint } from '../../../src/install-cni/taint.js';

describe('withoutTaint', () => {
  it('drops only the taint with the key, keeps the others in order; null when there is none', () => {
    const t = [{ key: 'a', effect: 'NoSchedule' }, { key: 'meshcap.io/not-ready', effect: 'NoSchedule' }, { key: 'b', value: 'x', effect: 'NoExecute' }];
    expect(withoutTaint(t, 'meshcap.io/not-ready')).toEqual([t[0], t[2]]);
    expect(withoutTaint(t, 'other')).toBeNull();
    expect(withoutTaint(undefined, 'a')).toBeNull();
    expect(withoutTaint([t[1]!], 'meshcap.io/not-ready')).toEqual([]);
  });
});
