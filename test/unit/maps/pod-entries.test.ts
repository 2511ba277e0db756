import { describe, expect, it } from 'vitest';
import { podEntries, RANGE_MIN, splitPorts } from '../../../src/maps/pod-entries.js';
import { CidrKind, MC_PORT_RANGES, mcCidrKey, mcPod, mcPortKey, mcPortRange, mcPortRangeKey, PodFlag, PortKind } from '../../../src/maps/layout.js';
import { istioCapture } from '../../helpers/pods.js';

const NS = 0x1122334455667788n;
const ports = (e: ReturnType<typeof podEntries>) => e.ports.map((p) => mcPortKey.decode(p.key)).map((k) => `${k.kind}:${k.port}`).sort();
const cidrs = (e: ReturnType<typeof podEntries>) =>
  e.cidrs.map((c) => mcCidrKey.decode(c.key)).map((k) => `${k.kind}/${k.prefixlen - 96}/${k.addr.subarray(0, 4).join('.')}`).sort();

describe('pod -> map entries', () => {
  it('Istio CNI defaults: capture all out and in, 15020 excluded out, 15020/15021/15090 in', () => {
    const e = podEntries(NS, istioCapture({ ips: ['198.18.0.5'], ipv6: false }), ['198.18.0.5']);
    const pod = mcPod.decode(e.pod.value);
    expect(pod).toMatchObject({ outbound_port: 15001, inbound_port: 15006, tunnel_port: 15008, dns_port: 15053, proxy_uid: 1337, proxy_gid: 1337, n_addr4: 1, n_addr6: 0 });
    // 15020 excluded outbound: only the include-port and exclude-CIDR lookups are skipped
    expect(pod.flags).toBe(PodFlag.OUT_ALL4 | PodFlag.OUT_ALL6 | PodFlag.IN_CAPTURE | PodFlag.IN_ALL | PodFlag.NO_OUT_IPORTS | PodFlag.NO_OUT_XCIDRS);
    expect([...pod.addr4.subarray(0, 4)]).toEqual([198, 18, 0, 5]);
    expect(ports(e)).toEqual([`${PortKind.OUT_EXCLUDE}:15020`, `${PortKind.IN_EXCLUDE}:15020`, `${PortKind.IN_EXCLUDE}:15021`, `${PortKind.IN_EXCLUDE}:15090`].sort());
    expect(e.cidrs).toEqual([]);
    expect(e.pod.key.readBigUInt64LE(0)).toBe(NS);
  });

  it('IPv6 addresses set the IPv6 flag and fill addr6', () => {
    const pod = mcPod.decode(podEntries(NS, istioCapture({ ips: ['2001:db8::5'] }), ['2001:db8::5']).pod.value);
    expect(pod.flags & PodFlag.IPV6).toBeTruthy();
    expect(pod.n_addr6).toBe(1);
    expect(pod.addr6.subarray(0, 16).toString('hex')).toBe('20010db8000000000000000000000005');
  });

  it('a config\'s pods share its encoded part, each with its own addresses in order; a fifth address of a family is refused', () => {
    const cfg = istioCapture({ ips: ['198.18.0.5'] });
    const a = mcPod.decode(podEntries(NS, cfg, ['198.18.0.5', '2001:db8::5', '198.18.0.6']).pod.value);
    const b = mcPod.decode(podEntries(NS, cfg, ['198.18.0.7']).pod.value);
    expect(a).toMatchObject({ n_addr4: 2, n_addr6: 1, proxy_uid: 1337 });
    expect([...a.addr4]).toEqual([198, 18, 0, 5, 198, 18, 0, 6, ...Array(8).fill(0)]);
    expect(a.addr6.subarray(0, 16).toString('hex')).toBe('20010db8000000000000000000000005');
    expect(a.addr6.subarray(16).every((x) => x === 0)).toBe(true);
    // the second pod's value is its own: nothing of the first one's addresses
    expect(b).toMatchObject({ n_addr4: 1, n_addr6: 0, flags: a.flags });
    expect([...b.addr4]).toEqual([198, 18, 0, 7, ...Array(12).fill(0)]);
    expect(b.addr6.every((x) => x === 0)).toBe(true);
    expect(() => podEntries(NS, cfg, ['198.18.0.1', '198.18.0.2', '198.18.0.3', '198.18.0.4', '198.18.0.5'])).toThrow(/more than 4 IPv4 addresses/);
    expect(() => podEntries(NS, cfg, ['198.18.0.300'])).toThrow(/not an IP address/);
  });

  it('include/exclude CIDRs become LPM keys of the right kind and prefix', () => {
    const e = podEntries(NS, istioCapture({
      ipv6: true,
      annotations: {
        'traffic.sidecar.istio.io/includeOutboundIPRanges': '10.0.0.0/8,2001:db8::/32',
        'traffic.sidecar.istio.io/excludeOutboundIPRanges': '10.1.0.0/16',
      },
    }), []);
    expect(mcPod.decode(e.pod.value).flags & (PodFlag.OUT_ALL4 | PodFlag.OUT_ALL6)).toBe(0);
    expect(cidrs(e)).toEqual([`${CidrKind.OUT_EXCLUDE4}/16/10.1.0.0`, `${CidrKind.OUT_INCLUDE4}/8/10.0.0.0`, `${CidrKind.OUT_INCLUDE6}/32/32.1.13.184`].sort());
  });

  it('an include list of ports only captures those ports', () => {
    const e = podEntries(NS, istioCapture({ annotations: { 'traffic.sidecar.istio.io/includeOutboundIPRanges': '', 'traffic.sidecar.istio.io/includeOutboundPorts': '80,443' } }), []);
    expect(ports(e)).toContain(`${PortKind.OUT_INCLUDE}:80`);
    expect(ports(e)).toContain(`${PortKind.OUT_INCLUDE}:443`);
    expect(mcPod.decode(e.pod.value).flags & PodFlag.OUT_ALL4).toBe(0);
  });

  it('includeInboundPorts list -> IN_INCLUDE keys and no IN_ALL', () => {
    const e = podEntries(NS, istioCapture({ annotations: { 'traffic.sidecar.istio.io/includeInboundPorts': '8080,9090' } }), []);
    const flags = mcPod.decode(e.pod.value).flags;
    expect(flags & PodFlag.IN_CAPTURE).toBeTruthy();
    expect(flags & PodFlag.IN_ALL).toBe(0);
    expect(ports(e).filter((p) => p.startsWith(`${PortKind.IN_INCLUDE}:`))).toEqual([`${PortKind.IN_INCLUDE}:8080`, `${PortKind.IN_INCLUDE}:9090`]);
  });

  it('flags each outbound list the pod has nothing in (NO_OUT_*: connect4/6 skip that lookup), and only those', () => {
    const NO_ALL = PodFlag.NO_OUT_XPORTS | PodFlag.NO_OUT_IPORTS | PodFlag.NO_OUT_XCIDRS;
    const flags = (annotations: Record<string, string>) => mcPod.decode(podEntries(NS, istioCapture({ ipv6: true, annotations }), []).pod.value).flags & NO_ALL;
    expect(flags({ 'traffic.sidecar.istio.io/excludeOutboundPorts': '' })).toBe(NO_ALL);
    expect(flags({})).toBe(PodFlag.NO_OUT_IPORTS | PodFlag.NO_OUT_XCIDRS); // 15020
    expect(flags({ 'traffic.sidecar.istio.io/excludeOutboundPorts': '', 'traffic.sidecar.istio.io/includeOutboundPorts': '443' })).toBe(PodFlag.NO_OUT_XPORTS | PodFlag.NO_OUT_XCIDRS);
    expect(flags({ 'traffic.sidecar.istio.io/excludeOutboundPorts': '', 'traffic.sidecar.istio.io/excludeOutboundIPRanges': '2001:db8::/32' })).toBe(PodFlag.NO_OUT_XPORTS | PodFlag.NO_OUT_IPORTS);
    expect(flags({ 'traffic.sidecar.istio.io/excludeOutboundPorts': '', 'traffic.sidecar.istio.io/excludeOutboundIPRanges': '10.1.0.0/16' })).toBe(PodFlag.NO_OUT_XPORTS | PodFlag.NO_OUT_IPORTS);
    // a range alone (no single port) is still an exclusion
    const wide = Array.from({ length: 100 }, (_, i) => String(20000 + i)).join(',');
    expect(flags({ 'traffic.sidecar.istio.io/excludeOutboundPorts': wide })).toBe(PodFlag.NO_OUT_IPORTS | PodFlag.NO_OUT_XCIDRS);
  });

  it('DNS capture sets its flags', () => {
    const f = mcPod.decode(podEntries(NS, istioCapture({ proxyEnv: { ISTIO_META_DNS_CAPTURE: 'true' } }), []).pod.value).flags;
    expect(f & PodFlag.DNS && f & PodFlag.DNS_ALL).toBeTruthy();
    expect(f & PodFlag.TPROXY).toBe(0);
  });

  it('has no small per-pod caps: 200 CIDRs and 200 ports', () => {
    const many = Array.from({ length: 200 }, (_, i) => `10.${i}.0.0/16`).join(',');
    const manyPorts = Array.from({ length: 200 }, (_, i) => String(20000 + 2 * i)).join(',');
    const e = podEntries(NS, istioCapture({ annotations: { 'traffic.sidecar.istio.io/excludeOutboundIPRanges': many, 'traffic.sidecar.istio.io/excludeOutboundPorts': manyPorts } }), []);
    expect(e.cidrs).toHaveLength(200);
    expect(e.ports.filter((p) => mcPortKey.decode(p.key).kind === PortKind.OUT_EXCLUDE)).toHaveLength(200);
  });

  it('stores a wide port range as one range, not one mc_ports entry per port, and flags the pod', () => {
    // Istio's annotations take single ports only: 4,096 of them listed one by one
    const wide = Array.from({ length: 4096 }, (_, i) => String(1024 + i)).join(',');
    const e = podEntries(NS, istioCapture({ annotations: { 'traffic.sidecar.istio.io/excludeOutboundPorts': `${wide},53` } }), []);
    expect(e.ports.filter((p) => mcPortKey.decode(p.key).kind === PortKind.OUT_EXCLUDE).map((p) => mcPortKey.decode(p.key).port)).toEqual([53]);
    expect(e.ranges).toHaveLength(1);
    const k = mcPortRangeKey.decode(e.ranges[0]!.key);
    expect([k.kind, k.idx]).toEqual([PortKind.OUT_EXCLUDE, 0]);
    expect(mcPortRange.decode(e.ranges[0]!.value)).toMatchObject({ lo: 1024, hi: 1024 + 4095 });
    expect(mcPod.decode(e.pod.value).flags & PodFlag.PORT_RANGES).toBe(PodFlag.PORT_RANGES);
    expect(mcPod.decode(podEntries(NS, istioCapture({}), []).pod.value).flags & PodFlag.PORT_RANGES).toBe(0);
  });
});

describe('splitPorts', () => {
  it('keeps short runs as single ports and RANGE_MIN-long runs as ranges', () => {
    const short = Array.from({ length: RANGE_MIN - 1 }, (_, i) => 100 + i);
    const long = Array.from({ length: RANGE_MIN }, (_, i) => 200 + i);
    expect(splitPorts([...long, ...short, 7])).toEqual({ singles: [7, ...short], ranges: [[200, 200 + RANGE_MIN - 1]] });
  });

  it('keeps the widest MC_PORT_RANGES runs as ranges, expands the rest', () => {
    const runs = Array.from({ length: MC_PORT_RANGES + 1 }, (_, r) => Array.from({ length: RANGE_MIN + r }, (_, i) => 1000 * (r + 1) + i)).flat();
    const out = splitPorts(runs);
    expect(out.ranges).toHaveLength(MC_PORT_RANGES);
    expect(out.ranges[0]).toEqual([2000, 2000 + RANGE_MIN]); // the narrowest run (r = 0, at 1000) is the one expanded
    expect(out.singles).toEqual(Array.from({ length: RANGE_MIN }, (_, i) => 1000 + i));
  });

  it('dedups and sorts', () => {
    expect(splitPorts([5, 3, 5, 4])).toEqual({ singles: [3, 4, 5], ranges: [] });
  });
});
