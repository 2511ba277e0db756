// Pod manifest -> CaptureConfig, for the two profiles.
// Istio: a port of cni/pkg/plugin/sidecar_redirect.go NewRedirect plus the
// config that sidecar_iptables_linux.go Program builds from it (the sidecar
// istio-cni plugin's pod-to-rules path). Linkerd: linkerd2 proxy-init's
// arguments as the injector derives them from config.linkerd.io/* annotations.
import type { V1Container, V1Pod } from '@kubernetes/client-node';
import { parseCidr } from './cidr.js';
import { buildCaptureConfig, CaptureConfigError, type CaptureConfig, type CaptureSettings, type FieldSources } from './config.js';
import {
  ISTIO_ANNOTATIONS,
  ISTIO_PROXY_CONTAINER,
  LINKERD_ANNOTATIONS,
  LINKERD_PROXY_CONTAINER,
  parseGoBool,
  type MeshProfile,
} from '../mesh/vocabulary.js';
import {
  ISTIO_CNI_ALWAYS_EXCLUDED_INBOUND,
  ISTIO_CNI_DEFAULTS,
  LINKERD_DEFAULT_SKIPPED_PORTS,
  LINKERD_DEFAULTS,
} from './profiles.js';

/**
 * buildCaptureConfig for a pod's settings, one config per distinct settings
 * and sources. A node's pods share a few (one per workload): a meshed ADD
 * built and validated its config afresh (~35 us: every CIDR and port list
 * parsed) only for the agent to swap it for the shared one of the same
 * settings (src/agent/state-store.ts, sharedConfig). The same config object
 * comes back for the same input, so it must not be changed (nothing does:
 * configs are already shared between pods). An invalid one throws each time
 * (nothing is kept). Bounded: cleared when full, like the agent's configs.
 */
const built = new Map<string, CaptureConfig>();
const BUILT_KEPT = 256;
function buildShared(s: CaptureSettings, sources: FieldSources): CaptureConfig {
  const key = JSON.stringify(s) + JSON.stringify(sources);
  let cfg = built.get(key);
  if (!cfg) {
    cfg = buildCaptureConfig(s, sources);
    if (built.size >= BUILT_KEPT) built.clear();
    built.set(key, cfg);
  }
  return cfg;
}

export interface PodCaptureOptions {
  /** Render IPv6 too. Default: Istio's rule (ipv6FromPodIPs) on the pod's addresses. */
  enableIPv6?: boolean;
  /**
   * The pod's addresses in order, as this node knows them (the CNI chain's
   * prevResult at ADD, when status.podIPs is still empty); default status.podIPs.
   */
  podIPs?: readonly string[];
  /** Istio only warns about unparsable proxy env booleans; this receives those warnings. */
  onWarning?: (message: string) => void;
}

/** The proxy container: a regular container, or a native sidecar (init container). */
export function findContainer(pod: V1Pod, name: string): V1Container | undefined {
  return pod.spec?.containers?.find((c) => c.name === name) ?? pod.spec?.initContainers?.find((c) => c.name === name);
}

function proxyEnv(c: V1Container | undefined): Map<string, string> {
  // Istio reads e.Value only; valueFrom entries count as "".
  return new Map((c?.env ?? []).map((e) => [e.name, e.value ?? '']));
}

function annotationError(field: keyof CaptureSettings, key: string, value: string, detail: string): never {
  throw new CaptureConfigError(field, `annotation ${key}`, value, detail);
}

// --- Istio's annotation validators (sidecar_redirect.go) ---------------------

function istioParsePorts(field: keyof CaptureSettings, key: string, value: string): void {
  const s = value.trim();
  if (s.length === 0) return;
  for (const p of s.split(',')) {
    const t = p.trim();
    if (!/^[0-9]+$/.test(t) || Number(t) > 65535) annotationError(field, key, value, `failed parsing port "${p}"`);
  }
}

function istioPortListWithWildcard(field: keyof CaptureSettings, key: string, value: string): void {
  if (value !== '*') istioParsePorts(field, key, value);
}

function istioCidrList(field: keyof CaptureSettings, key: string, value: string, wildcard: boolean): void {
  if (wildcard && value === '*') return;
  if (value.length === 0) return;
  for (const c of value.split(',')) {
    try {
      parseCidr(c);
    } catch (e) {
      annotationError(field, key, value, `failed parsing cidr '${c}': ${(e as Error).message}`);
    }
  }
}

/** netutil.ValidateInterfaceNames: trimmed, not empty, at most 15 bytes, a letter then [a-zA-Z0-9_.-]. */
function istioInterfaceNames(field: keyof CaptureSettings, key: string, value: string): void {
  if (value.length === 0) return;
  for (const raw of value.split(',')) {
    const n = raw.trim();
    if (n.length === 0) annotationError(field, key, value, 'empty interface name');
    if (Buffer.byteLength(n, 'utf8') > 15) annotationError(field, key, value, `interface name "${n}" too long (max 15 chars)`);
    if (!/^[a-zA-Z][a-zA-Z0-9_.-]*$/.test(n)) annotationError(field, key, value, `interface name "${n}" contains invalid characters`);
  }
}

function envBool(env: Map<string, string>, name: string, warn: (m: string) => void): boolean | undefined {
  const v = env.get(name);
  if (v === undefined) return undefined;
  const b = parseGoBool(v);
  if (b === undefined) {
    warn(`cannot parse ${name}=${JSON.stringify(v)} of container ${ISTIO_PROXY_CONTAINER} as a boolean; treating it as false (as Istio does)`);
    return false;
  }
  return b;
}

/**
 * Istio's rule (config.getLocalIP, run inside the pod's namespace): the first
 * non-loopback address decides, and the kernel lists a namespace's IPv4
 * addresses before its IPv6 ones whatever order the pod's addresses were
 * given in; with dual stack on, any IPv6 address turns IPv6 on. So IPv6 is
 * captured for an IPv6-only pod, or with ISTIO_DUAL_STACK. (Checked against
 * istio-cni's own code in a namespace with the pod's addresses:
 * test/privileged/istio-diff/pods.test.ts; a v6-first dual-stack pod gets no
 * IPv6 rules from istio-cni.)
 */
export function ipv6FromPodIPs(pod: V1Pod, dualStack: boolean, known?: readonly string[]): boolean {
  const ips = known && known.length > 0 ? [...known] : (pod.status?.podIPs ?? []).map((p) => p.ip).filter((ip): ip is string => !!ip);
  if (ips.length === 0 && pod.status?.podIP) ips.push(pod.status.podIP);
  if (ips.length === 0) return false;
  const anyV6 = ips.some((ip) => ip.includes(':'));
  return dualStack ? anyV6 : anyV6 && ips.every((ip) => ip.includes(':'));
}

/** sidecar_redirect.go NewRedirect + sidecar_iptables_linux.go Program. */
export function istioPodToCaptureConfig(pod: V1Pod, opts: PodCaptureOptions = {}): CaptureConfig {
  const ann = pod.metadata?.annotations ?? {};
  const A = ISTIO_ANNOTATIONS;
  const sources: FieldSources = {};
  const take = (
    field: keyof CaptureSettings,
    key: string,
    dflt: string,
    validate: (v: string) => void,
  ): { found: boolean; value: string } => {
    const v = ann[key];
    if (v === undefined) return { found: false, value: dflt };
    validate(v);
    sources[field] = `annotation ${key}`;
    return { found: true, value: v };
  };
  const warn = opts.onWarning ?? (() => {});
  const s: CaptureSettings = { ...ISTIO_CNI_DEFAULTS, dnsServersV4: [], dnsServersV6: [] };

  const mode = take('inboundInterceptionMode', A.interceptionMode, 'REDIRECT', (v) => {
    if (v !== 'REDIRECT' && v !== 'TPROXY') annotationError('inboundInterceptionMode', A.interceptionMode, v, `interceptionMode invalid: ${v}`);
  }).value;
  s.inboundInterceptionMode = mode as CaptureSettings['inboundInterceptionMode'];

  const proxy = findContainer(pod, ISTIO_PROXY_CONTAINER);
  // runAsUser/runAsGroup nil or 0 fall back to 1337.
  const uid = proxy?.securityContext?.runAsUser;
  const gid = proxy?.securityContext?.runAsGroup;
  s.proxyUID = [uid ? String(uid) : '1337'];
  s.proxyGID = [gid ? String(gid) : '1337'];
  if (uid) sources.proxyUID = `container ${ISTIO_PROXY_CONTAINER} securityContext.runAsUser`;
  if (gid) sources.proxyGID = `container ${ISTIO_PROXY_CONTAINER} securityContext.runAsGroup`;

  s.outboundIPRangesInclude = take('outboundIPRangesInclude', A.includeOutboundIPRanges, '*',
    (v) => istioCidrList('outboundIPRangesInclude', A.includeOutboundIPRanges, v, true)).value;
  s.outboundIPRangesExclude = take('outboundIPRangesExclude', A.excludeOutboundIPRanges, '',
    (v) => istioCidrList('outboundIPRangesExclude', A.excludeOutboundIPRanges, v, false)).value;
  let excludeInbound = take('inboundPortsExclude', A.excludeInboundPorts, '15020',
    (v) => istioPortListWithWildcard('inboundPortsExclude', A.excludeInboundPorts, v)).value;
  s.inboundPortsInclude = take('inboundPortsInclude', A.includeInboundPorts, '*',
    (v) => istioPortListWithWildcard('inboundPortsInclude', A.includeInboundPorts, v)).value;
  s.outboundPortsExclude = take('outboundPortsExclude', A.excludeOutboundPorts, '15020',
    (v) => istioPortListWithWildcard('outboundPortsExclude', A.excludeOutboundPorts, v)).value;
  s.outboundPortsInclude = take('outboundPortsInclude', A.includeOutboundPorts, '',
    (v) => istioPortListWithWildcard('outboundPortsInclude', A.includeOutboundPorts, v)).value;
  // status.sidecar.istio.io/port has a validator in istio-cni's registry, but
  // NewRedirect never reads it: any value passes.

  // "Add 15090 to sync with non-cni injection template": append and de-duplicate.
  excludeInbound = excludeInbound.trim();
  if (excludeInbound.length > 0 && !excludeInbound.endsWith(',')) excludeInbound += ',';
  excludeInbound += ISTIO_CNI_ALWAYS_EXCLUDED_INBOUND.join(',');
  s.inboundPortsExclude = [...new Set(excludeInbound.split(','))].join(',');

  s.excludeInterfaces = take('excludeInterfaces', A.excludeInterfaces, '', (v) => istioInterfaceNames('excludeInterfaces', A.excludeInterfaces, v)).value;
  // kubevirtInterfaces is deprecated: reroute-virtual-interfaces wins when both are set.
  const reroute = take('kubeVirtInterfaces', A.rerouteVirtualInterfaces, '', (v) => istioInterfaceNames('kubeVirtInterfaces', A.rerouteVirtualInterfaces, v));
  s.kubeVirtInterfaces = reroute.found ? reroute.value
    : take('kubeVirtInterfaces', A.kubevirtInterfaces, '', (v) => istioInterfaceNames('kubeVirtInterfaces', A.kubevirtInterfaces, v)).value;

  const env = proxyEnv(proxy);
  const dns = envBool(env, 'ISTIO_META_DNS_CAPTURE', warn) ?? false;
  s.dualStack = envBool(env, 'ISTIO_DUAL_STACK', warn) ?? false;
  s.dropInvalid = envBool(env, 'INVALID_DROP', warn) ?? false;
  // Program(): the CNI path always captures all DNS when DNS capture is on.
  s.redirectDNS = dns;
  s.captureAllDNS = dns;
  s.enableIPv6 = opts.enableIPv6 ?? ipv6FromPodIPs(pod, s.dualStack, opts.podIPs);

  return buildShared(s, sources);
}

function linkerdPortList(field: keyof CaptureSettings, key: string, value: string): string {
  // Linkerd accepts ports and ranges ("4000-5000"); iptables spells ranges with ':'.
  const out: string[] = [];
  for (const raw of value.split(',')) {
    const t = raw.trim();
    if (t === '') continue;
    const m = /^([0-9]+)(?:-([0-9]+))?$/.exec(t);
    if (!m || Number(m[1]) > 65535 || (m[2] !== undefined && (Number(m[2]) > 65535 || Number(m[2]) < Number(m[1])))) {
      annotationError(field, key, value, `"${t}" is not a port or port range`);
    }
    out.push(m[2] !== undefined ? `${m[1]}:${m[2]}` : (m[1] as string));
  }
  return out.join(',');
}

function linkerdPort(field: keyof CaptureSettings, key: string, value: string): string {
  const t = value.trim();
  if (!/^[0-9]+$/.test(t) || Number(t) < 1 || Number(t) > 65535) annotationError(field, key, value, 'not a port number');
  return t;
}

/** linkerd2 proxy-init arguments as the injector builds them from annotations. */
export function linkerdPodToCaptureConfig(pod: V1Pod, opts: PodCaptureOptions = {}): CaptureConfig {
  const ann = pod.metadata?.annotations ?? {};
  const L = LINKERD_ANNOTATIONS;
  const sources: FieldSources = {};
  const s: CaptureSettings = { ...LINKERD_DEFAULTS, proxyUID: [...LINKERD_DEFAULTS.proxyUID], dnsServersV4: [], dnsServersV6: [] };
  const get = (field: keyof CaptureSettings, key: string): string | undefined => {
    const v = ann[key];
    if (v !== undefined) sources[field] = `annotation ${key}`;
    return v;
  };

  const inbound = get('inboundCapturePort', L.inboundPort);
  if (inbound !== undefined) s.inboundCapturePort = s.inboundTunnelPort = linkerdPort('inboundCapturePort', L.inboundPort, inbound);
  const outbound = get('proxyPort', L.outboundPort);
  if (outbound !== undefined) s.proxyPort = linkerdPort('proxyPort', L.outboundPort, outbound);

  const control = ann[L.controlPort] !== undefined ? linkerdPort('inboundPortsExclude', L.controlPort, ann[L.controlPort]!) : '4190';
  const admin = ann[L.adminPort] !== undefined ? linkerdPort('inboundPortsExclude', L.adminPort, ann[L.adminPort]!) : '4191';
  const skipIn = get('inboundPortsExclude', L.skipInboundPorts);
  const extraIn = skipIn !== undefined ? linkerdPortList('inboundPortsExclude', L.skipInboundPorts, skipIn) : LINKERD_DEFAULT_SKIPPED_PORTS.join(',');
  s.inboundPortsExclude = [control, admin, extraIn].filter((x) => x !== '').join(',');
  const skipOut = get('outboundPortsExclude', L.skipOutboundPorts);
  s.outboundPortsExclude = skipOut !== undefined
    ? linkerdPortList('outboundPortsExclude', L.skipOutboundPorts, skipOut)
    : LINKERD_DEFAULT_SKIPPED_PORTS.join(',');

  const subnets = get('outboundIPRangesExclude', L.skipSubnets);
  if (subnets !== undefined) {
    const list = subnets.split(',').map((x) => x.trim()).filter((x) => x !== '');
    for (const c of list) {
      try {
        parseCidr(c);
      } catch (e) {
        annotationError('outboundIPRangesExclude', L.skipSubnets, subnets, (e as Error).message);
      }
    }
    s.outboundIPRangesExclude = list.join(',');
  }

  const uid = get('proxyUID', L.proxyUid);
  if (uid !== undefined) {
    if (!/^[0-9]+$/.test(uid.trim())) annotationError('proxyUID', L.proxyUid, uid, 'not a numeric uid');
    s.proxyUID = [uid.trim()];
  } else {
    const runAs = findContainer(pod, LINKERD_PROXY_CONTAINER)?.securityContext?.runAsUser;
    if (runAs) s.proxyUID = [String(runAs)];
  }
  const gidAnn = get('proxyGID', L.proxyGid);
  if (gidAnn !== undefined && !/^[0-9]+$/.test(gidAnn.trim())) annotationError('proxyGID', L.proxyGid, gidAnn, 'not a numeric gid');
  // proxy-init without --proxy-gid only matches the uid; Istio's model needs a
  // gid, so the uid doubles as it unless the pod names one.
  s.proxyGID = [gidAnn !== undefined ? gidAnn.trim() : (s.proxyUID[0] as string)];
  s.enableIPv6 = opts.enableIPv6 ?? ipv6FromPodIPs(pod, false, opts.podIPs);

  return buildShared(s, sources);
}

export function podToCaptureConfig(pod: V1Pod, profile: MeshProfile, opts: PodCaptureOptions = {}): CaptureConfig {
  return profile === 'istio' ? istioPodToCaptureConfig(pod, opts) : linkerdPodToCaptureConfig(pod, opts);
}
