import { describe, expect, it } from 'vitest';
import { podEntries } from '../../../src/maps/pod-entries.js';
import { CidrKind, mcCidrKey, mcPod, mcPortKey, PodFlag, PortKind } from '../../../src/maps/layout.js';
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
    expect(pod.flags).toBe(PodFlag.OUT_ALL4 | PodFlag.OUT_ALL6 | PodFlag.IN_CAPTURE | PodFlag.IN_ALL);
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

  it('DNS capture sets its flags', () => {
    const f = mcPod.decode(podEntries(NS, istioCapture({ proxyEnv: { ISTIO_META_DNS_CAPTURE: 'true' } }), []).pod.value).flags;
    expect(f & PodFlag.DNS && f & PodFlag.DNS_ALL).toBeTruthy();
    expect(f & PodFlag.TPROXY).toBe(0);
  });

  it('has no small per-pod caps: 200 CIDRs and 200 ports', () => {
    const many = Array.from({ length: 200 }, (_, i) => `10.${i}.0.0/16`).join(',');
    const manyPorts = Array.from({ length: 200 }, (_, i) => String(20000 + i)).join(',');
    const e = podEntries(NS, istioCapture({ annotations: { 'traffic.sidecar.istio.io/excludeOutboundIPRanges': many, 'traffic.sidecar.istio.io/excludeOutboundPorts': manyPorts } }), []);
    expect(e.cidrs).toHaveLength(200);
    expect(e.ports.filter((p) => mcPortKey.decode(p.key).kind === PortKind.OUT_EXCLUDE)).toHaveLength(200);
  });
});
