import { describe, expect, it } from 'vitest';
import { describeForeignBefore, foreignBefore, type AttachedProgram } from '../../../src/loader/cgroup-order.js';

const p = (id: number, attachType: string, name: string): AttachedProgram => ({ id, attachType, name });

describe('foreign programs before meshcap on connect4/6', () => {
  it('names a foreign program attached before ours, per hook', () => {
    const progs = [
      p(1, 'cgroup_inet4_connect', 'cil_sock4_connect'), p(2, 'cgroup_inet4_connect', 'mc_connect4'),
      p(3, 'cgroup_inet6_connect', 'mc_connect6'), p(4, 'cgroup_inet6_connect', 'cil_sock6_connect'),
    ];
    const f = foreignBefore(progs, new Set([2, 3]));
    expect(f).toEqual([{ hook: 'cgroup_inet4_connect', programs: [progs[0]] }]);
    expect(describeForeignBefore(f[0]!)).toMatch(/^cgroup_inet4_connect: cil_sock4_connect \(prog id 1\) runs before meshcap's program/);
  });

  it('another meshcap instance before ours is not foreign; hooks without ours and other hooks are ignored', () => {
    const progs = [
      p(1, 'cgroup_inet4_connect', 'mc_connect4'), p(2, 'cgroup_inet4_connect', 'mc_connect4'),
      p(5, 'cgroup_sock_ops', 'other_sockops'), p(6, 'cgroup_inet6_connect', 'lb6'),
    ];
    expect(foreignBefore(progs, new Set([2]))).toEqual([]);
  });

  it('a foreign program after ours is fine', () => {
    expect(foreignBefore([p(2, 'cgroup_inet4_connect', 'mc_connect4'), p(9, 'cgroup_inet4_connect', 'lb')], new Set([2]))).toEqual([]);
  });
});
