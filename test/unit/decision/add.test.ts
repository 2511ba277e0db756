import { describe, expect, it } from 'vitest';
import { decideAdd, podIPsOf } from '../../../src/decision/add.js';
import { istioPod } from '../../helpers/pods.js';

const prev = (ips: string[], sandbox = true) => ({
  cniVersion: '1.0.0',
  interfaces: [{ name: 'br0' }, { name: 'eth0', sandbox: sandbox ? '/var/run/netns/x' : '' }],
  ips: ips.map((address, i) => ({ address, interface: i === 0 ? 1 : 0 })),
});

describe('podIPsOf', () => {
  it('takes the sandbox interface addresses from prevResult, without prefix', () => {
    // the second ip sits on the host-side bridge (interface 0): not the pod's
    expect(podIPsOf(prev(['198.18.0.5/24', '198.18.0.1/24']))).toEqual(['198.18.0.5']);
  });
  it('takes every ip when no interface is in a sandbox', () => {
    expect(podIPsOf({ ips: [{ address: '198.18.0.5/24' }, { address: '2001:db8::5/64' }] })).toEqual(['198.18.0.5', '2001:db8::5']);
  });
  it('falls back to status.podIPs and skips junk and duplicates', () => {
    expect(podIPsOf(undefined, istioPod({ ips: ['198.18.0.7', 'nope', '198.18.0.7'] }))).toEqual(['198.18.0.7']);
    expect(podIPsOf({ ips: 'x' } as never, istioPod({ ips: ['198.18.0.8'] }))).toEqual(['198.18.0.8']);
    expect(podIPsOf(undefined)).toEqual([]);
  });
});

describe('decideAdd', () => {
  const input = { nodeMode: 'ebpf' as const, prevResult: prev(['198.18.0.5/24']) };

  it('captures a meshed Istio pod in the node mode, with prevResult addresses', () => {
    const d = decideAdd(istioPod(), input);
    expect(d.kind).toBe('capture');
    if (d.kind !== 'capture') return;
    expect(d).toMatchObject({ profile: 'istio', mode: 'ebpf', podIPs: ['198.18.0.5'] });
    expect(d.fallbackReason).toBeUndefined();
    expect(d.config.parsed.proxyPort).toBe(15001);
    expect(d.config.enableIPv6).toBe(false);
  });

  it('decides IPv6 capture by Istio\'s rule on the addresses: IPv6-only, or any IPv6 with ISTIO_DUAL_STACK (the kernel lists IPv4 first)', () => {
    const v6 = (ips: string[], proxyEnv?: Record<string, string>) => {
      const d = decideAdd(istioPod(proxyEnv ? { proxyEnv } : {}), { ...input, prevResult: { ips: ips.map((address) => ({ address })) } });
      if (d.kind !== 'capture') throw new Error('not captured');
      return d.config.enableIPv6;
    };
    expect(v6(['198.18.0.5/24'])).toBe(false);
    expect(v6(['2001:db8::5/64'])).toBe(true);
    expect(v6(['198.18.0.5/24', '2001:db8::5/64']), 'v4-first dual stack, dual stack off').toBe(false);
    expect(v6(['2001:db8::5/64', '198.18.0.5/24']), 'v6-first: istio-cni sees IPv4 first in the namespace').toBe(false);
    expect(v6(['2001:db8::5/64', '198.18.0.5/24'], { ISTIO_DUAL_STACK: 'true' }), 'v6-first, dual stack on').toBe(true);
    expect(v6(['198.18.0.5/24', '2001:db8::5/64'], { ISTIO_DUAL_STACK: 'true' }), 'dual stack on').toBe(true);
  });

  it('skips unmeshed pods, with the reason', () => {
    const plain = istioPod();
    plain.spec!.containers = [{ name: 'app' }];
    plain.metadata!.annotations = {};
    expect(decideAdd(plain, input)).toMatchObject({ kind: 'skip', reason: expect.stringContaining('istio-proxy') });
    // the namespace is not asked again: the agent asks namespaceExclusion first, once
    expect(decideAdd(istioPod({ namespace: 'kube-system' }), input)).toMatchObject({ kind: 'capture' });
    expect(decideAdd(istioPod({ annotations: { 'sidecar.istio.io/inject': 'false' } }), input).kind).toBe('skip');
  });

  it('uses iptables mode on an iptables node', () => {
    expect(decideAdd(istioPod(), { ...input, nodeMode: 'iptables' })).toMatchObject({ kind: 'capture', mode: 'iptables' });
  });

  it('falls back to iptables mode for one pod whose settings eBPF cannot honour, saying why', () => {
    const d = decideAdd(istioPod({ annotations: { 'traffic.sidecar.istio.io/excludeInterfaces': 'eth1' } }), input);
    expect(d).toMatchObject({ kind: 'capture', mode: 'iptables', fallbackReason: expect.stringContaining('not supported in eBPF mode') });
  });

  it('gives a user-namespaced pod (hostUsers: false) iptables mode, saying why; TPROXY likewise', () => {
    const userns = istioPod();
    userns.spec!.hostUsers = false;
    expect(decideAdd(userns, input)).toMatchObject({ kind: 'capture', mode: 'iptables', fallbackReason: expect.stringMatching(/hostUsers: false.*host uids/) });
    const hostUsers = istioPod();
    hostUsers.spec!.hostUsers = true;
    expect(decideAdd(hostUsers, input)).toMatchObject({ kind: 'capture', mode: 'ebpf' });
    const tproxy = istioPod({ annotations: { 'sidecar.istio.io/interceptionMode': 'TPROXY' } });
    expect(decideAdd(tproxy, input)).toMatchObject({ kind: 'capture', mode: 'iptables', fallbackReason: expect.stringContaining('TPROXY') });
  });

  it('throws (for the caller to name the pod) on an invalid annotation', () => {
    expect(() => decideAdd(istioPod({ annotations: { 'traffic.sidecar.istio.io/excludeOutboundPorts': 'http' } }), input)).toThrow(/excludeOutboundPorts/);
  });
});
