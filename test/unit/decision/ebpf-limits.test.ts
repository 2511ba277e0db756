import { describe, expect, it } from 'vitest';
import { configLimit, ebpfLimits, limitMessage, UnsupportedInEbpfError } from '../../../src/decision/ebpf-limits.js';
import { buildCaptureConfig, type CaptureConfig } from '../../../src/redirect/config.js';
import { istioCapture, istioPod } from '../../helpers/pods.js';

/** The message decideAdd gives as the pod's fallback reason, or undefined. */
const why = (cfg: CaptureConfig, ips: string[] = []) => {
  const l = configLimit(cfg, ips);
  return l ? limitMessage(l) : undefined;
};

describe('eBPF limits (pure: no map bytes built)', () => {
  it('accepts the Istio defaults and up to 4 addresses per family', () => {
    expect(configLimit(istioCapture(), ['10.0.0.1', '10.0.0.2', '10.0.0.3', '10.0.0.4', '2001:db8::1'])).toBeUndefined();
    expect(ebpfLimits(istioPod(), istioCapture(), ['10.0.0.1'])).toBeUndefined();
  });

  it('refuses TPROXY, an include range covering loopback and a non-default loopback CIDR, naming the setting', () => {
    expect(why(istioCapture({ annotations: { 'sidecar.istio.io/interceptionMode': 'TPROXY' } }))).toMatch(/TPROXY.*not supported in eBPF mode/);
    expect(why(istioCapture({ annotations: { 'traffic.sidecar.istio.io/includeOutboundIPRanges': '127.0.0.0/8,198.18.0.0/15' } }))).toMatch(/includeOutboundIPRanges: a range covering loopback/);
    // (istio-iptables' ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR; pods always get the default)
    const { parsed: _parsed, ...settings } = istioCapture();
    expect(why(buildCaptureConfig({ ...settings, hostIPv4LoopbackCidr: '127.0.0.0/8' }))).toMatch(/ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR: 127.0.0.0\/8/);
    expect(why(buildCaptureConfig({ ...settings, hostIPv4LoopbackCidr: '127.0.0.1/32' }))).toBeUndefined();
  });

  it('refuses what eBPF mode cannot honour instead of half-capturing', () => {
    expect(configLimit(istioCapture({ annotations: { 'traffic.sidecar.istio.io/excludeInterfaces': 'eth1' } }), [])).toMatchObject({ setting: expect.stringContaining('excludeInterfaces') });
    expect(why(istioCapture(), ['10.0.0.1', '10.0.0.2', '10.0.0.3', '10.0.0.4', '10.0.0.5'])).toMatch(/more than 4 addresses/);
    const err = new UnsupportedInEbpfError({ setting: 'proxy uid', detail: 'more than one uid (1,2)' });
    expect(err.message).toBe('proxy uid: more than one uid (1,2) is not supported in eBPF mode (use iptables mode for this pod or node)');
    expect(err.setting).toBe('proxy uid');
  });

  it('names a user-namespaced pod before any config limit', () => {
    const userns = istioPod();
    userns.spec!.hostUsers = false;
    expect(ebpfLimits(userns, istioCapture({ annotations: { 'sidecar.istio.io/interceptionMode': 'TPROXY' } }), [])).toMatch(/^hostUsers: false.*host uids/);
  });
});
