// Defaults of the two supported meshes. Istio values come from istio-iptables
// (tools/common/config DefaultConfig + cmd/root.go flag defaults) and the
// sidecar istio-cni plugin (cni/pkg/plugin/sidecar_redirect.go). Linkerd
// values come from linkerd2's proxy-init template and chart values.
import type { MeshProfile } from '../mesh/vocabulary.js';
import type { CaptureSettings } from './config.js';

/** istio-iptables with no flags and no environment (outbound/inbound capture off). */
export const ISTIO_IPTABLES_DEFAULTS: Readonly<CaptureSettings> = Object.freeze({
  proxyPort: '15001',
  inboundCapturePort: '15006',
  inboundTunnelPort: '15008',
  proxyUID: [],
  proxyGID: [],
  inboundInterceptionMode: 'REDIRECT',
  inboundTProxyMark: '1337',
  inboundTProxyRouteTable: '133',
  inboundPortsInclude: '',
  inboundPortsExclude: '',
  outboundPortsInclude: '',
  outboundPortsExclude: '',
  outboundIPRangesInclude: '',
  outboundIPRangesExclude: '',
  kubeVirtInterfaces: '',
  excludeInterfaces: '',
  redirectDNS: false,
  captureAllDNS: false,
  dropInvalid: false,
  dualStack: false,
  enableIPv6: false,
  dnsServersV4: [],
  dnsServersV6: [],
  ownerGroupsInclude: '*',
  ownerGroupsExclude: '',
  hostIPv4LoopbackCidr: '127.0.0.1/32',
}) as CaptureSettings;

/** constants.DefaultProxyUID, used when ENVOY_USER does not resolve. */
export const ISTIO_DEFAULT_PROXY_UID = '1337';

/** Ports istio-cni always excludes inbound (status 15020, health 15021, prometheus 15090). */
export const ISTIO_CNI_ALWAYS_EXCLUDED_INBOUND = ['15020', '15021', '15090'] as const;

/** What the sidecar istio-cni plugin programs for a pod without annotations. */
export const ISTIO_CNI_DEFAULTS: Readonly<CaptureSettings> = Object.freeze({
  ...ISTIO_IPTABLES_DEFAULTS,
  proxyUID: ['1337'],
  proxyGID: ['1337'],
  inboundPortsInclude: '*',
  inboundPortsExclude: '15020,15021,15090',
  outboundPortsExclude: '15020',
  outboundIPRangesInclude: '*',
}) as CaptureSettings;

export const LINKERD_OUTBOUND_PORT = '4140';
export const LINKERD_INBOUND_PORT = '4143';
export const LINKERD_PROXY_UID = '2102';
/** proxy control (4190) and admin (4191) ports: proxy-init always skips them inbound. */
export const LINKERD_ALWAYS_SKIPPED_INBOUND = ['4190', '4191'] as const;
/**
 * linkerd2 chart values proxyInit.ignoreInboundPorts / ignoreOutboundPorts
 * default to "4567,4568" (the linkerd control plane's policy/identity ports on
 * other pods); the chart appends them to the always-skipped ports.
 */
export const LINKERD_DEFAULT_SKIPPED_PORTS = ['4567', '4568'] as const;

/**
 * Linkerd expressed in Istio's capture model. Linkerd has no tunnel port; the
 * inbound proxy port doubles as it, which only means "a connection addressed
 * to 4143 itself is not redirected again" — what linkerd's own rules do too.
 */
export const LINKERD_DEFAULTS: Readonly<CaptureSettings> = Object.freeze({
  ...ISTIO_IPTABLES_DEFAULTS,
  proxyPort: LINKERD_OUTBOUND_PORT,
  inboundCapturePort: LINKERD_INBOUND_PORT,
  inboundTunnelPort: LINKERD_INBOUND_PORT,
  proxyUID: [LINKERD_PROXY_UID],
  proxyGID: [LINKERD_PROXY_UID],
  inboundPortsInclude: '*',
  inboundPortsExclude: [...LINKERD_ALWAYS_SKIPPED_INBOUND, ...LINKERD_DEFAULT_SKIPPED_PORTS].join(','),
  outboundPortsExclude: LINKERD_DEFAULT_SKIPPED_PORTS.join(','),
  outboundIPRangesInclude: '*',
}) as CaptureSettings;

export function profileDefaults(name: MeshProfile): CaptureSettings {
  const d = name === 'istio' ? ISTIO_CNI_DEFAULTS : LINKERD_DEFAULTS;
  return { ...d, proxyUID: [...d.proxyUID], proxyGID: [...d.proxyGID], dnsServersV4: [], dnsServersV6: [] };
}
