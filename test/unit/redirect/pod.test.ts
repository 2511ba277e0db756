import { describe, expect, it } from 'vitest';
import type { V1Pod } from '@kubernetes/client-node';
import { CaptureConfigError } from '../../../src/redirect/config.js';
import { istioPodToCaptureConfig, linkerdPodToCaptureConfig, podToCaptureConfig } from '../../../src/redirect/pod.js';

function istioPod(annotations: Record<string, string>, env: Record<string, string> = {}, sc: object = {}): V1Pod {
  return {
    metadata: { name: 'p', namespace: 'ns', annotations: { 'sidecar.istio.io/status': 'true', ...annotations } },
    spec: {
      containers: [
        { name: 'app' },
        { name: 'istio-proxy', env: Object.entries(env).map(([name, value]) => ({ name, value })), securityContext: sc },
      ],
    },
  };
}

const lpod = (annotations: Record<string, string> = {}): V1Pod => ({ metadata: { annotations }, spec: { containers: [{ name: 'app' }, { name: 'linkerd-proxy' }] } });

describe('istioPodToCaptureConfig (sidecar_redirect.go NewRedirect)', () => {
  it('uses Istio CNI defaults', () => {
    const c = istioPodToCaptureConfig(istioPod({}));
    expect(c).toMatchObject({
      inboundInterceptionMode: 'REDIRECT', outboundIPRangesInclude: '*', inboundPortsInclude: '*',
      inboundPortsExclude: '15020,15021,15090', outboundPortsExclude: '15020', proxyUID: ['1337'], proxyGID: ['1337'],
      redirectDNS: false, captureAllDNS: false, dropInvalid: false, enableIPv6: false,
    });
    expect(c.parsed).toMatchObject({ inboundIncludeAll: true, outboundIncludeAll: true, inboundExcludePorts: [15020, 15021, 15090] });
  });

  it('appends and de-duplicates the always-excluded inbound ports', () => {
    expect(istioPodToCaptureConfig(istioPod({ 'traffic.sidecar.istio.io/excludeInboundPorts': '3333,15021' })).inboundPortsExclude)
      .toBe('3333,15021,15020,15090');
    expect(istioPodToCaptureConfig(istioPod({ 'traffic.sidecar.istio.io/excludeInboundPorts': '' })).inboundPortsExclude)
      .toBe('15020,15021,15090');
  });

  it('reads annotations, proxy env and securityContext', () => {
    const c = istioPodToCaptureConfig(istioPod({
      'sidecar.istio.io/interceptionMode': 'TPROXY',
      'traffic.sidecar.istio.io/includeOutboundIPRanges': '10.0.0.0/8',
      'traffic.sidecar.istio.io/excludeOutboundIPRanges': '10.1.0.0/16,2001:db8::/32',
      'traffic.sidecar.istio.io/includeOutboundPorts': '8080',
      'traffic.sidecar.istio.io/excludeInterfaces': 'eth1',
      'traffic.sidecar.istio.io/kubevirtInterfaces': 'old0',
      'istio.io/reroute-virtual-interfaces': 'net1',
    }, { ISTIO_META_DNS_CAPTURE: 'true', INVALID_DROP: 'true', ISTIO_DUAL_STACK: 'true' }, { runAsUser: 1000, runAsGroup: 2000 }));
    expect(c).toMatchObject({
      inboundInterceptionMode: 'TPROXY', outboundIPRangesInclude: '10.0.0.0/8', outboundPortsInclude: '8080',
      excludeInterfaces: 'eth1', kubeVirtInterfaces: 'net1', redirectDNS: true, captureAllDNS: true, dropInvalid: true,
      dualStack: true, proxyUID: ['1000'], proxyGID: ['2000'],
    });
    expect(c.parsed.dnsCapture).toBe('all');
    expect(c.parsed.outboundExcludeCidrs.v6).toHaveLength(1);
  });

  it('derives IPv6 from the pod IPs like getLocalIP', () => {
    const p = istioPod({});
    // the kernel lists IPv4 first in the pod's namespace, so istio-cni sees IPv4 (test/privileged/istio-diff/pods.test.ts)
    p.status = { podIPs: [{ ip: '2001:db8::5' }, { ip: '10.0.0.5' }] };
    expect(istioPodToCaptureConfig(p).enableIPv6).toBe(false);
    p.status = { podIPs: [{ ip: '2001:db8::5' }] };
    expect(istioPodToCaptureConfig(p).enableIPv6).toBe(true);
    p.status = { podIPs: [{ ip: '10.0.0.5' }, { ip: '2001:db8::5' }] };
    expect(istioPodToCaptureConfig(p).enableIPv6).toBe(false);
    expect(istioPodToCaptureConfig(istioPod({}, { ISTIO_DUAL_STACK: 'true' }))).toMatchObject({ enableIPv6: false });
  });

  it('warns (and treats as false) an unparsable proxy env boolean, as Istio does', () => {
    const warnings: string[] = [];
    const c = istioPodToCaptureConfig(istioPod({}, { ISTIO_META_DNS_CAPTURE: 'yes' }), { onWarning: (m) => warnings.push(m) });
    expect(c.redirectDNS).toBe(false);
    expect(warnings[0]).toMatch(/ISTIO_META_DNS_CAPTURE/);
  });

  it.each([
    ['sidecar.istio.io/interceptionMode', 'tproxy'],
    ['traffic.sidecar.istio.io/includeOutboundIPRanges', '10.0.0.0/8,'],
    ['traffic.sidecar.istio.io/excludeOutboundIPRanges', '*'],
    ['traffic.sidecar.istio.io/includeInboundPorts', '80,abc'],
    ['traffic.sidecar.istio.io/excludeInboundPorts', '*'],
    ['traffic.sidecar.istio.io/excludeOutboundPorts', '99999'],
    ['traffic.sidecar.istio.io/includeOutboundPorts', '*'],
    ['traffic.sidecar.istio.io/excludeInterfaces', 'a very bad name'],
    ['traffic.sidecar.istio.io/kubevirtInterfaces', 'eth0,'],
  ])('rejects %s=%j naming the annotation', (key, value) => {
    let err: unknown;
    try {
      istioPodToCaptureConfig(istioPod({ [key]: value }));
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(CaptureConfigError);
    expect((err as Error).message).toContain(`annotation ${key}`);
  });
  it('takes any status.sidecar.istio.io/port, and interface names as istio-cni trims them (NewRedirect never reads the port; ValidateInterfaceNames trims)', () => {
    expect(() => istioPodToCaptureConfig(istioPod({ 'status.sidecar.istio.io/port': 'x' }))).not.toThrow();
    expect(istioPodToCaptureConfig(istioPod({ 'traffic.sidecar.istio.io/excludeInterfaces': ' eth1' })).parsed.excludeInterfaces).toEqual(['eth1']);
  });


  it('finds istio-proxy as a native sidecar (init container)', () => {
    const p: V1Pod = { metadata: {}, spec: { containers: [{ name: 'app' }], initContainers: [{ name: 'istio-proxy', restartPolicy: 'Always', securityContext: { runAsUser: 555 } }] } };
    expect(istioPodToCaptureConfig(p).proxyUID).toEqual(['555']);
  });
});

describe('linkerdPodToCaptureConfig', () => {

  it('uses proxy-init defaults', () => {
    const c = podToCaptureConfig(lpod(), 'linkerd');
    expect(c).toMatchObject({ proxyPort: '4140', inboundCapturePort: '4143', proxyUID: ['2102'], inboundPortsInclude: '*', outboundIPRangesInclude: '*' });
    expect(c.parsed.inboundExcludePorts).toEqual([4190, 4191, 4567, 4568]);
    expect(c.parsed.outboundExcludePorts).toEqual([4567, 4568]);
  });

  it('maps config.linkerd.io annotations', () => {
    const c = linkerdPodToCaptureConfig(lpod({
      'config.linkerd.io/skip-inbound-ports': '25,3306-3308',
      'config.linkerd.io/skip-outbound-ports': '443',
      'config.linkerd.io/skip-subnets': '10.0.0.0/8, 2001:db8::/32',
      'config.linkerd.io/proxy-uid': '3000',
    }));
    expect(c.inboundPortsExclude).toBe('4190,4191,25,3306:3308');
    expect(c.parsed.inboundExcludePorts).toEqual([4190, 4191, 25, 3306, 3307, 3308]);
    expect(c.parsed.outboundExcludePorts).toEqual([443]);
    expect(c.outboundIPRangesExclude).toBe('10.0.0.0/8,2001:db8::/32');
    expect(c.parsed.proxyUids).toEqual([3000]);
    expect(c.parsed.proxyGids).toEqual([3000]);
  });

  it.each([
    ['config.linkerd.io/skip-subnets', '10.0.0.0/40'],
    ['config.linkerd.io/skip-inbound-ports', '80-70'],
    ['config.linkerd.io/skip-outbound-ports', 'http'],
    ['config.linkerd.io/proxy-uid', 'linkerd'],
  ])('rejects %s=%j naming the annotation', (key, value) => {
    expect(() => linkerdPodToCaptureConfig(lpod({ [key]: value }))).toThrow(`annotation ${key}`);
  });
});

describe('one config object per distinct settings (a node has a few workloads, not a config per pod)', () => {
  it('hands back the same object for the same settings and sources, another for others', () => {
    const a = istioPodToCaptureConfig(istioPod({ 'traffic.sidecar.istio.io/excludeOutboundPorts': '8181' }));
    const b = istioPodToCaptureConfig(istioPod({ 'traffic.sidecar.istio.io/excludeOutboundPorts': '8181' }));
    expect(b).toBe(a);
    // other settings; the same settings from another source (the error message names it); another profile
    const other = istioPodToCaptureConfig(istioPod({ 'traffic.sidecar.istio.io/excludeOutboundPorts': '8182' }));
    expect(other).not.toBe(a);
    expect(other.parsed.outboundExcludePorts).toContain(8182);
    expect(istioPodToCaptureConfig(istioPod({}))).not.toBe(istioPodToCaptureConfig(istioPod({ 'traffic.sidecar.istio.io/excludeOutboundPorts': '15020' })));
    const l = linkerdPodToCaptureConfig(lpod({ 'config.linkerd.io/skip-outbound-ports': '443' }));
    expect(linkerdPodToCaptureConfig(lpod({ 'config.linkerd.io/skip-outbound-ports': '443' }))).toBe(l);
  });

  it('still refuses an invalid annotation every time, and still warns every time', () => {
    for (let i = 0; i < 3; i++) {
      expect(() => istioPodToCaptureConfig(istioPod({ 'traffic.sidecar.istio.io/excludeOutboundPorts': '99999' }))).toThrow(CaptureConfigError);
    }
    const warnings: string[] = [];
    for (let i = 0; i < 2; i++) istioPodToCaptureConfig(istioPod({}, { ISTIO_META_DNS_CAPTURE: 'yes' }), { onWarning: (m) => warnings.push(m) });
    expect(warnings).toHaveLength(2);
  });

  it('keeps IPv6 apart: the same annotations with and without IPv6 are two configs', () => {
    const v4 = istioPodToCaptureConfig(istioPod({}), { podIPs: ['10.0.0.5'] });
    const v6 = istioPodToCaptureConfig(istioPod({}), { podIPs: ['2001:db8::5'] });
    expect(v4.enableIPv6).toBe(false);
    expect(v6.enableIPv6).toBe(true);
    expect(istioPodToCaptureConfig(istioPod({}), { podIPs: ['10.0.0.6'] })).toBe(v4);
  });
});
