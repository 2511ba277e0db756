// The neutral capture-config model both datapaths consume (eBPF map writer and
// the iptables fallback). Raw fields mirror istio-iptables' config.Config
// (tools/common/config) in camelCase and keep Istio's textual values so the
// iptables renderer can reproduce istio-iptables byte for byte; `parsed` holds
// validated, typed forms a datapath can use without re-parsing.
import { cidrToString, isLoopbackCidr, parseAddr, parseCidr, type Cidr } from './cidr.js';

export type { Cidr } from './cidr.js';

export type InterceptionMode = 'REDIRECT' | 'TPROXY';

export interface CidrsByFamily {
  v4: Cidr[];
  v6: Cidr[];
}

/** Istio's config.Config fields that affect capture (values as Istio holds them). */
export interface CaptureSettings {
  proxyPort: string;
  inboundCapturePort: string;
  inboundTunnelPort: string;
  /** uids whose traffic is never redirected (Istio: comma list in one string). */
  proxyUID: string[];
  proxyGID: string[];
  inboundInterceptionMode: InterceptionMode;
  inboundTProxyMark: string;
  inboundTProxyRouteTable: string;
  /** '*' = all ports, '' = no inbound capture, else comma list. */
  inboundPortsInclude: string;
  /** Only applies when inboundPortsInclude is '*'. */
  inboundPortsExclude: string;
  outboundPortsInclude: string;
  outboundPortsExclude: string;
  /** '*' = all, '' = none, else comma list of CIDRs. */
  outboundIPRangesInclude: string;
  outboundIPRangesExclude: string;
  /** Istio RerouteVirtualInterfaces (flag -k / kube-virt-interfaces). */
  kubeVirtInterfaces: string;
  excludeInterfaces: string;
  redirectDNS: boolean;
  captureAllDNS: boolean;
  dropInvalid: boolean;
  dualStack: boolean;
  /** Render/apply IPv6 rules too (Istio autodetects this; meshcap is told). */
  enableIPv6: boolean;
  dnsServersV4: string[];
  dnsServersV6: string[];
  /** ISTIO_OUTBOUND_OWNER_GROUPS: '*' or comma list of group names/gids. */
  ownerGroupsInclude: string;
  /** ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE (only with include '*'). */
  ownerGroupsExclude: string;
  /** ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR */
  hostIPv4LoopbackCidr: string;
}

export interface ParsedCapture {
  proxyPort: number;
  inboundCapturePort: number;
  inboundTunnelPort: number;
  /** istio-agent DNS listener (constants.IstioAgentDNSListenerPort). */
  dnsPort: number;
  proxyUids: number[];
  proxyGids: number[];
  tproxy: boolean;
  inboundTProxyMark: number;
  inboundTProxyRouteTable: number;
  /** False when inboundPortsInclude is '' (no inbound capture at all). */
  inboundCapture: boolean;
  inboundIncludeAll: boolean;
  /** Listed ports when not includeAll. */
  inboundIncludePorts: number[];
  /** Effective only when inboundIncludeAll. The tunnel port is always excluded too. */
  inboundExcludePorts: number[];
  outboundIncludePorts: number[];
  outboundExcludePorts: number[];
  outboundIncludeAll: boolean;
  outboundIncludeCidrs: CidrsByFamily;
  outboundExcludeCidrs: CidrsByFamily;
  /** An include CIDR is a loopback address: then app->self via lo is captured. */
  outboundIncludesLoopback: boolean;
  kubeVirtInterfaces: string[];
  excludeInterfaces: string[];
  /** Effective DNS capture: Istio turns redirectDNS off without servers or capture-all. */
  dnsCapture: 'off' | 'all' | 'servers';
  dnsServersV4: string[];
  dnsServersV6: string[];
  /** Owner-group filter (config.ParseInterceptFilter): except=true means all groups but values. */
  ownerGroups: { except: boolean; values: string[] };
  hostIPv4Loopback: Cidr;
}

export interface CaptureConfig extends CaptureSettings {
  parsed: ParsedCapture;
}

export const ISTIO_DNS_PORT = 15053;
/** config.validation maxOwnerGroupsInclude */
export const MAX_OWNER_GROUPS_INCLUDE = 64;

/** An invalid setting; `source` names the flag, env var or annotation it came from. */
export class CaptureConfigError extends Error {
  constructor(
    readonly field: keyof CaptureSettings,
    readonly source: string,
    readonly value: string,
    detail: string,
  ) {
    super(`invalid ${source} "${value}": ${detail}`);
    this.name = 'CaptureConfigError';
  }
}

/** Where each field came from, for error messages (flag, env var, annotation). */
export type FieldSources = Partial<Record<keyof CaptureSettings, string>>;

/** istio config.Split: split on ',' dropping empty items. */
export function splitList(s: string): string[] {
  if (s === '') return [];
  return s.split(',').filter((x) => x !== '');
}

function fail(field: keyof CaptureSettings, sources: FieldSources, value: string, detail: string): never {
  throw new CaptureConfigError(field, sources[field] ?? field, value, detail);
}

function port(field: keyof CaptureSettings, sources: FieldSources, text: string): number {
  const t = text.trim();
  if (!/^[0-9]{1,5}$/.test(t) || Number(t) > 65535) {
    fail(field, sources, text, `"${text}" is not a port number (0-65535)`);
  }
  return Number(t);
}

function uint(field: keyof CaptureSettings, sources: FieldSources, text: string, max: number): number {
  if (!/^[0-9]+$/.test(text) || Number(text) > max) fail(field, sources, text, `"${text}" is not an integer in 0..${max}`);
  return Number(text);
}

/** Port list: tokens are numbers, or (Linkerd-style) ranges lo-hi / lo:hi. */
function portList(field: keyof CaptureSettings, sources: FieldSources, list: string): number[] {
  const out: number[] = [];
  for (const tok of splitList(list)) {
    const range = /^\s*([0-9]+)\s*[-:]\s*([0-9]+)\s*$/.exec(tok);
    if (range) {
      const lo = port(field, sources, range[1] ?? '');
      const hi = port(field, sources, range[2] ?? '');
      if (hi < lo) fail(field, sources, list, `range "${tok}" is reversed`);
      for (let p = lo; p <= hi; p++) out.push(p);
      continue;
    }
    if (tok.trim() === '*') fail(field, sources, list, `"*" is not allowed in a port list here`);
    out.push(port(field, sources, tok));
  }
  return [...new Set(out)];
}

function cidrList(field: keyof CaptureSettings, sources: FieldSources, list: string): CidrsByFamily {
  const out: CidrsByFamily = { v4: [], v6: [] };
  for (const tok of splitList(list)) {
    let c: Cidr;
    try {
      c = parseCidr(tok);
    } catch (e) {
      return fail(field, sources, list, (e as Error).message);
    }
    (c.family === 4 ? out.v4 : out.v6).push(c);
  }
  return out;
}

function ifaceList(field: keyof CaptureSettings, sources: FieldSources, list: string): string[] {
  // iptables-restore splits its lines on blanks, so " eth1" is eth1 (as Istio trims it too)
  const names = splitList(list).map((n) => n.trim());
  for (const n of names) {
    // Linux IFNAMSIZ is 16 bytes incl. NUL (bytes, not characters: "eth\u00e9" is 5);
    // '/', ':' and whitespace are never valid.
    if (Buffer.byteLength(n, 'utf8') > 15 || /[\s/:]/.test(n) || n === '.' || n === '..') {
      fail(field, sources, list, `"${n}" is not a valid interface name`);
    }
  }
  return names;
}

function idList(field: keyof CaptureSettings, sources: FieldSources, ids: string[]): number[] {
  if (ids.length === 0) fail(field, sources, '', 'at least one id is required');
  return ids.map((id) => uint(field, sources, id, 0xffffffff));
}

/** config.ParseInterceptFilter */
export function parseInterceptFilter(include: string, exclude: string): { except: boolean; values: string[] } {
  if (include === '*') return { except: true, values: splitList(exclude) };
  return { except: false, values: splitList(include) };
}

export interface BuildOptions {
  /**
   * istio-iptables' own leniency (the `iptables render` flag path): values it
   * hands to iptables verbatim (ports, port lists, uids/gids, mark, route
   * table, interface names, owner-group names) are not rejected here but
   * reported to this callback; their parsed forms are then NaN / empty. Only
   * a renderer may use such a config (the datapaths need the parsed values).
   */
  onVerbatim?: (e: CaptureConfigError) => void;
}

/** Fields istio-iptables passes to iptables as they are, without parsing. */
const VERBATIM_FIELDS: ReadonlySet<keyof CaptureSettings> = new Set<keyof CaptureSettings>([
  'proxyPort', 'inboundCapturePort', 'inboundTunnelPort', 'proxyUID', 'proxyGID', 'inboundTProxyMark',
  'inboundTProxyRouteTable', 'inboundPortsInclude', 'inboundPortsExclude', 'outboundPortsInclude',
  'outboundPortsExclude', 'kubeVirtInterfaces', 'excludeInterfaces', 'ownerGroupsInclude', 'ownerGroupsExclude',
]);

/**
 * Validates settings and derives the parsed forms. Throws CaptureConfigError
 * naming the offending flag/annotation (from `sources`).
 */
export function buildCaptureConfig(s: CaptureSettings, sources: FieldSources = {}, opts: BuildOptions = {}): CaptureConfig {
  const onVerbatim = opts.onVerbatim;
  // A verbatim field's problem goes to onVerbatim (when given) and yields `fallback`.
  const unused = <T>(parse: () => T, fallback: T): T => {
    try {
      return parse();
    } catch (e) {
      if (!(e instanceof CaptureConfigError)) throw e;
      return fallback;
    }
  };
  const lenient = <T>(field: keyof CaptureSettings, parse: () => T, fallback: T): T => {
    if (!onVerbatim || !VERBATIM_FIELDS.has(field)) return parse();
    try {
      return parse();
    } catch (e) {
      if (!(e instanceof CaptureConfigError)) throw e;
      onVerbatim(e);
      return fallback;
    }
  };
  if (s.inboundInterceptionMode !== 'REDIRECT' && s.inboundInterceptionMode !== 'TPROXY') {
    fail('inboundInterceptionMode', sources, String(s.inboundInterceptionMode), 'must be "REDIRECT" or "TPROXY"');
  }
  const inboundIncludeAll = s.inboundPortsInclude === '*';
  const outboundIncludeAll = s.outboundIPRangesInclude === '*';
  if (s.outboundIPRangesExclude === '*') {
    // capture/run.go: "invalid value for OUTBOUND_IP_RANGES_EXCLUDE"
    fail('outboundIPRangesExclude', sources, '*', 'the wildcard is not allowed for excluded ranges');
  }
  const include = outboundIncludeAll ? { v4: [], v6: [] } : cidrList('outboundIPRangesInclude', sources, s.outboundIPRangesInclude);
  const exclude = cidrList('outboundIPRangesExclude', sources, s.outboundIPRangesExclude);

  let hostIPv4Loopback: Cidr;
  try {
    hostIPv4Loopback = parseCidr(s.hostIPv4LoopbackCidr);
  } catch (e) {
    return fail('hostIPv4LoopbackCidr', sources, s.hostIPv4LoopbackCidr, (e as Error).message);
  }
  // config.ValidateIPv4LoopbackCidr
  if (hostIPv4Loopback.family !== 4 || !isLoopbackCidr(hostIPv4Loopback)) {
    fail('hostIPv4LoopbackCidr', sources, s.hostIPv4LoopbackCidr, 'expected an IPv4 loopback CIDR');
  }
  if (hostIPv4Loopback.prefix < 8) {
    fail('hostIPv4LoopbackCidr', sources, s.hostIPv4LoopbackCidr, 'mask must be in range [8, 32]');
  }

  const ownerGroups = parseInterceptFilter(s.ownerGroupsInclude, s.ownerGroupsExclude);
  if (!ownerGroups.except && ownerGroups.values.length > MAX_OWNER_GROUPS_INCLUDE) {
    fail('ownerGroupsInclude', sources, s.ownerGroupsInclude,
      `number of owner groups whose outgoing traffic should be redirected to Envoy cannot exceed ${MAX_OWNER_GROUPS_INCLUDE}, got ${ownerGroups.values.length}`);
  }
  for (const g of ownerGroups.values) {
    const field = ownerGroups.except ? 'ownerGroupsExclude' : 'ownerGroupsInclude';
    lenient(field, () => (/[\s,]/.test(g) ? fail(field, sources, g, 'not a group name or gid') : undefined), undefined);
  }

  const dnsV4 = s.dnsServersV4.map((a) => {
    const p = parseAddr(a);
    if (!p || p.family !== 4) fail('dnsServersV4', sources, a, 'not an IPv4 address');
    return a;
  });
  const dnsV6 = s.dnsServersV6.map((a) => {
    const p = parseAddr(a);
    if (!p || p.family !== 6) fail('dnsServersV6', sources, a, 'not an IPv6 address');
    return a;
  });
  let dnsCapture: ParsedCapture['dnsCapture'] = 'off';
  if (s.redirectDNS) {
    if (s.captureAllDNS) dnsCapture = 'all';
    else if (dnsV4.length > 0 || dnsV6.length > 0) dnsCapture = 'servers';
  }

  const inboundCapture = s.inboundPortsInclude !== '';
  const parsed: ParsedCapture = {
    proxyPort: lenient('proxyPort', () => port('proxyPort', sources, s.proxyPort), NaN),
    inboundCapturePort: lenient('inboundCapturePort', () => port('inboundCapturePort', sources, s.inboundCapturePort), NaN),
    inboundTunnelPort: lenient('inboundTunnelPort', () => port('inboundTunnelPort', sources, s.inboundTunnelPort), NaN),
    dnsPort: ISTIO_DNS_PORT,
    proxyUids: lenient('proxyUID', () => idList('proxyUID', sources, s.proxyUID), []),
    proxyGids: lenient('proxyGID', () => idList('proxyGID', sources, s.proxyGID), []),
    tproxy: s.inboundInterceptionMode === 'TPROXY',
    inboundTProxyMark: lenient('inboundTProxyMark', () => uint('inboundTProxyMark', sources, s.inboundTProxyMark, 0xffffffff), NaN),
    inboundTProxyRouteTable: lenient('inboundTProxyRouteTable', () => uint('inboundTProxyRouteTable', sources, s.inboundTProxyRouteTable, 0xffffffff), NaN),
    inboundCapture,
    inboundIncludeAll,
    inboundIncludePorts: inboundIncludeAll ? [] : lenient('inboundPortsInclude', () => portList('inboundPortsInclude', sources, s.inboundPortsInclude), []),
    // Istio renders the excluded inbound ports only when all inbound ports are
    // captured; otherwise any value (istio-cni lets "*" through) changes nothing
    inboundExcludePorts: inboundIncludeAll
      ? lenient('inboundPortsExclude', () => portList('inboundPortsExclude', sources, s.inboundPortsExclude), [])
      : unused(() => portList('inboundPortsExclude', sources, s.inboundPortsExclude), []),
    outboundIncludePorts: lenient('outboundPortsInclude', () => portList('outboundPortsInclude', sources, s.outboundPortsInclude), []),
    outboundExcludePorts: lenient('outboundPortsExclude', () => portList('outboundPortsExclude', sources, s.outboundPortsExclude), []),
    outboundIncludeAll,
    outboundIncludeCidrs: include,
    outboundExcludeCidrs: exclude,
    outboundIncludesLoopback: [...include.v4, ...include.v6].some(isLoopbackCidr),
    kubeVirtInterfaces: lenient('kubeVirtInterfaces', () => ifaceList('kubeVirtInterfaces', sources, s.kubeVirtInterfaces), splitList(s.kubeVirtInterfaces)),
    excludeInterfaces: lenient('excludeInterfaces', () => ifaceList('excludeInterfaces', sources, s.excludeInterfaces), splitList(s.excludeInterfaces)),
    dnsCapture,
    dnsServersV4: dnsV4,
    dnsServersV6: dnsV6,
    ownerGroups,
    hostIPv4Loopback,
  };
  return { ...s, proxyUID: [...s.proxyUID], proxyGID: [...s.proxyGID], parsed };
}

export { cidrToString };
