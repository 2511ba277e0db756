import { describe, expect, it } from 'vitest';
import { decideMode, ModeRefusedError, pinnedMode } from '../../../src/loader/mode.js';
import { REQUIRED_FEATURES, type FeatureResult } from '../../../src/loader/features.js';

const all = (ok = true): Record<string, FeatureResult> =>
  Object.fromEntries(REQUIRED_FEATURES.map((f) => [f.name, { ok, since: f.since, why: f.why }]));
const without = (...names: string[]) => {
  const f = all();
  for (const n of names) f[n] = { ...f[n]!, ok: false, detail: 'probe said no' };
  return f;
};

describe('mode decision', () => {
  it('5.10 with every hook -> ebpf', () => {
    expect(decideMode({ kernel: '5.10.0-28-amd64', features: all(), requested: 'auto' }).mode).toBe('ebpf');
  });

  it('4.18 -> iptables even if every probe said yes', () => {
    const d = decideMode({ kernel: '4.18.0-553.el8', features: all(), requested: 'auto' });
    expect(d.mode).toBe('iptables');
    expect(d.reasons.join()).toMatch(/below 4\.19/);
  });

  it('4.19 exactly is allowed by version', () => {
    expect(decideMode({ kernel: '4.19.0', features: all(), requested: 'auto' }).mode).toBe('ebpf');
  });

  it('a missing hook -> iptables, naming the hook and its kernel', () => {
    const d = decideMode({ kernel: '5.10.0', features: without('helper.sock_ops.get_netns_cookie'), requested: 'auto' });
    expect(d.mode).toBe('iptables');
    expect(d.reasons).toHaveLength(1);
    expect(d.reasons[0]).toMatch(/helper\.sock_ops\.get_netns_cookie missing \(needs Linux 5\.15\+/);
  });

  it('a hook the kernel has but refused the agent (EPERM) is named as not permitted, with the capabilities to give, not as a kernel too old', () => {
    const f = all();
    f['map_type.sockhash'] = { ...f['map_type.sockhash']!, ok: false, denied: true, detail: 'bpf_map_create a sockhash (this kernel lets only CAP_NET_ADMIN create one): Operation not permitted (EPERM)' };
    const d = decideMode({ kernel: '6.1.0-56-amd64', features: f, requested: 'auto' });
    expect(d.mode).toBe('iptables');
    expect(d.reasons).toHaveLength(1);
    expect(d.reasons[0]).toMatch(/^map_type\.sockhash not permitted to the agent .*CAP_NET_ADMIN.*EPERM.*give the agent's container the DaemonSet's capabilities \(NET_ADMIN, SYS_ADMIN\)$/);
    expect(d.reasons[0]).not.toMatch(/needs Linux/);
  });

  it('an unprobed feature is a blocker, not a pass', () => {
    const f = all();
    delete f['prog_type.sk_lookup'];
    expect(decideMode({ kernel: '6.1.0', features: f, requested: 'auto' }).mode).toBe('iptables');
  });

  it('--mode iptables forces iptables anywhere', () => {
    const d = decideMode({ kernel: '6.12.0', features: all(), requested: 'iptables' });
    expect(d).toEqual({ mode: 'iptables', reasons: ['iptables mode forced by --mode iptables'] });
  });

  it('--mode ebpf is refused with the missing hooks named', () => {
    expect(() => decideMode({ kernel: '5.4.0', features: without('prog_type.sk_lookup', 'link.sk_lookup'), requested: 'ebpf' }))
      .toThrow(ModeRefusedError);
    try {
      decideMode({ kernel: '5.4.0', features: without('prog_type.sk_lookup'), requested: 'ebpf' });
    } catch (e) {
      expect((e as Error).message).toMatch(/eBPF mode refused.*prog_type\.sk_lookup missing \(needs Linux 5\.9\+/);
    }
  });

  it('--mode ebpf on a capable kernel -> ebpf', () => {
    expect(decideMode({ kernel: '6.18.44', features: all(), requested: 'ebpf' }).mode).toBe('ebpf');
  });

  it('rejects a release it cannot parse', () => {
    expect(() => decideMode({ kernel: 'banana', features: all(), requested: 'auto' })).toThrow(/cannot parse kernel release/);
  });
});

describe('pinnedMode (mode is sticky)', () => {
  it('keeps eBPF mode without a probe where the datapath is pinned (auto or --mode ebpf)', () => {
    for (const req of ['auto', 'ebpf'] as const) {
      const d = pinnedMode(req, true, '/sys/fs/bpf/meshcap');
      expect(d?.mode).toBe('ebpf');
      expect(d?.reasons[0]).toMatch(/pinned under \/sys\/fs\/bpf\/meshcap.*no probe/);
    }
  });
  it('probes (null) without pins; --mode iptables wins over pins', () => {
    expect(pinnedMode('auto', false, '/p')).toBeNull();
    expect(pinnedMode('iptables', true, '/p')).toBeNull();
  });
});
