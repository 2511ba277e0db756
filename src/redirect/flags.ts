// istio-iptables argv + environment -> CaptureConfig, following
// tools/istio-iptables/pkg/cmd/root.go (pflag syntax, flag.BindEnv env names,
// AdditionalEnv aliases; the command line wins over the environment) and
// config.FillConfigFromEnvironment (env-only settings, proxy uid default).
// Istio does not validate most values; meshcap rejects invalid ones up front
// with the flag's name, as the issue asks.
import { readFileSync } from 'node:fs';
import {
  buildCaptureConfig,
  CaptureConfigError,
  splitList,
  type CaptureConfig,
  type CaptureSettings,
  type FieldSources,
} from './config.js';
import { ISTIO_PROXY_USER, parseGoBool } from '../mesh/vocabulary.js';
import { ISTIO_DEFAULT_PROXY_UID, ISTIO_IPTABLES_DEFAULTS } from './profiles.js';

type Kind = 'string' | 'bool' | 'uint16' | 'duration';

interface FlagDef {
  long: string;
  short?: string;
  kind: Kind;
  /** CaptureSettings field, or a runtime-only key. */
  field?: keyof CaptureSettings;
  runtime?: keyof IstioRuntimeOptions;
  /** flag.BindEnv: FOO_BAR from foo-bar; false for flag.Bind (envoy-port). */
  env?: boolean;
  /** flag.AdditionalEnv aliases, applied after the primary env var. */
  aliases?: string[];
}

/** istio-iptables settings that do not change the rendered rules. */
export interface IstioRuntimeOptions {
  dryRun: boolean;
  iptablesProbePort: string;
  probeTimeout: string;
  skipRuleApply: boolean;
  runValidation: boolean;
  networkNamespace: string;
  cniMode: boolean;
  reconcile: boolean;
  cleanupOnly: boolean;
  forceApply: boolean;
  nativeNftables: boolean;
  forceIptablesBinary: string;
}

export const ISTIO_IPTABLES_FLAGS: readonly FlagDef[] = [
  { long: 'envoy-port', short: 'p', kind: 'string', field: 'proxyPort', env: false },
  { long: 'inbound-capture-port', short: 'z', kind: 'string', field: 'inboundCapturePort', env: true },
  { long: 'inbound-tunnel-port', short: 'e', kind: 'string', field: 'inboundTunnelPort', env: true },
  { long: 'proxy-uid', short: 'u', kind: 'string', field: 'proxyUID', env: true },
  { long: 'proxy-gid', short: 'g', kind: 'string', field: 'proxyGID', env: true },
  { long: 'istio-inbound-interception-mode', short: 'm', kind: 'string', field: 'inboundInterceptionMode', env: true },
  { long: 'istio-inbound-ports', short: 'b', kind: 'string', field: 'inboundPortsInclude', env: true },
  { long: 'istio-local-exclude-ports', short: 'd', kind: 'string', field: 'inboundPortsExclude', env: true },
  { long: 'istio-exclude-interfaces', short: 'c', kind: 'string', field: 'excludeInterfaces', env: true },
  { long: 'istio-service-cidr', short: 'i', kind: 'string', field: 'outboundIPRangesInclude', env: true },
  { long: 'istio-service-exclude-cidr', short: 'x', kind: 'string', field: 'outboundIPRangesExclude', env: true },
  { long: 'istio-outbound-ports', short: 'q', kind: 'string', field: 'outboundPortsInclude', env: true },
  { long: 'istio-local-outbound-ports-exclude', short: 'o', kind: 'string', field: 'outboundPortsExclude', env: true },
  { long: 'kube-virt-interfaces', short: 'k', kind: 'string', field: 'kubeVirtInterfaces', env: true },
  { long: 'istio-inbound-tproxy-mark', short: 't', kind: 'string', field: 'inboundTProxyMark', env: true },
  { long: 'istio-inbound-tproxy-route-table', short: 'r', kind: 'string', field: 'inboundTProxyRouteTable', env: true },
  { long: 'dry-run', short: 'n', kind: 'bool', runtime: 'dryRun', env: true },
  { long: 'iptables-probe-port', kind: 'uint16', runtime: 'iptablesProbePort', env: true },
  { long: 'probe-timeout', kind: 'duration', runtime: 'probeTimeout', env: true },
  { long: 'skip-rule-apply', kind: 'bool', runtime: 'skipRuleApply', env: true },
  { long: 'run-validation', kind: 'bool', runtime: 'runValidation', env: true },
  { long: 'redirect-dns', kind: 'bool', field: 'redirectDNS', env: true, aliases: ['ISTIO_META_DNS_CAPTURE'] },
  { long: 'drop-invalid', kind: 'bool', field: 'dropInvalid', env: true, aliases: ['INVALID_DROP'] },
  { long: 'dual-stack', kind: 'bool', field: 'dualStack', env: true, aliases: ['ISTIO_DUAL_STACK'] },
  { long: 'capture-all-dns', kind: 'bool', field: 'captureAllDNS', env: true },
  { long: 'network-namespace', kind: 'string', runtime: 'networkNamespace', env: true },
  { long: 'cni-mode', kind: 'bool', runtime: 'cniMode', env: true },
  { long: 'reconcile', kind: 'bool', runtime: 'reconcile', env: true },
  { long: 'cleanup-only', kind: 'bool', runtime: 'cleanupOnly', env: true },
  { long: 'force-apply', kind: 'bool', runtime: 'forceApply', env: true },
  { long: 'native-nftables', kind: 'bool', runtime: 'nativeNftables', env: true },
  { long: 'force-iptables-binary', kind: 'string', runtime: 'forceIptablesBinary', env: true },
];

/** Env-only settings (constants.go), read by FillConfigFromEnvironment. */
export const ENV_OWNER_GROUPS_INCLUDE = 'ISTIO_OUTBOUND_OWNER_GROUPS';
export const ENV_OWNER_GROUPS_EXCLUDE = 'ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE';
export const ENV_IPV4_LOOPBACK_CIDR = 'ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR';
export const ENV_ENVOY_USER = 'ENVOY_USER';

export class FlagParseError extends Error {
  constructor(readonly flag: string, message: string) {
    super(message);
    this.name = 'FlagParseError';
  }
}

export interface ParseFlagsOptions {
  /** Environment to read (istio-iptables reads its own); default: none. */
  env?: Record<string, string | undefined>;
  /** Istio autodetects IPv6 from the pod's addresses; meshcap is told. */
  enableIPv6?: boolean;
  /** Replace istio-iptables' reading of /etc/resolv.conf. */
  dnsServersV4?: string[];
  dnsServersV6?: string[];
  /** user name -> uid, for the ENVOY_USER default of -u; default reads /etc/passwd. */
  lookupUser?: (name: string) => string | undefined;
  /**
   * Render like istio-iptables: values it hands to iptables verbatim (and an
   * interception mode other than TPROXY, which means REDIRECT) are reported
   * here instead of rejected (config.ts BuildOptions.onVerbatim).
   */
  onVerbatim?: (message: string) => void;
  /** Environment values istio-iptables ignores (flag.BindEnv drops a failed Set). */
  onWarning?: (message: string) => void;
}

export interface ParsedFlags {
  config: CaptureConfig;
  runtime: IstioRuntimeOptions;
  /** Non-flag arguments (cobra accepts and ignores them). */
  args: string[];
}

export function envName(long: string): string {
  return long.toUpperCase().replace(/-/g, '_');
}

const GO_DURATION = /^[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+$|^[-+]?0$/;

/**
 * strconv.ParseUint(s, 0, 64), as pflag's uint flags read values: decimal,
 * 0x/0o/0b or a leading 0 (octal), underscores between digits only with a
 * base prefix. NaN when Go would fail.
 */
export function parseGoUint(text: string): number {
  const m = /^0([xXoObB])(.*)$/.exec(text);
  let base = 10;
  let digits = text;
  if (m) {
    base = { x: 16, o: 8, b: 2 }[(m[1] as string).toLowerCase() as 'x' | 'o' | 'b'];
    digits = m[2] as string;
  } else if (text.length > 1 && text.startsWith('0')) {
    base = 8;
    digits = text.slice(1);
  }
  if (digits.includes('_')) {
    // underscoreOK: only with a base prefix (or the octal 0), never doubled or at the end
    if (base === 10 || /__|_$/.test(digits) || (digits.startsWith('_') && !m && base !== 8)) return NaN;
    digits = digits.replace(/_/g, '');
  }
  const alphabet = '0123456789abcdef'.slice(0, base);
  if (digits === '' || ![...digits.toLowerCase()].every((c) => alphabet.includes(c))) return NaN;
  return parseInt(digits, base);
}

export function lookupUserInPasswd(name: string, passwdPath = '/etc/passwd'): string | undefined {
  let text: string;
  try {
    text = readFileSync(passwdPath, 'utf8');
  } catch {
    return undefined;
  }
  for (const line of text.split('\n')) {
    const [user, , uid] = line.split(':');
    if (user === name && uid !== undefined && /^\d+$/.test(uid)) return uid;
  }
  return undefined;
}

interface RawValues {
  strings: Map<FlagDef, string>;
}

function setValue(def: FlagDef, value: string, raw: RawValues, origin: string): void {
  switch (def.kind) {
    case 'bool':
      if (parseGoBool(value) === undefined) {
        throw new FlagParseError(def.long, `invalid argument "${value}" for ${origin}: not a boolean`);
      }
      break;
    case 'uint16':
      if (!(parseGoUint(value) <= 65535)) {
        throw new FlagParseError(def.long, `invalid argument "${value}" for ${origin}: not a port number`);
      }
      break;
    case 'duration':
      if (!GO_DURATION.test(value)) {
        throw new FlagParseError(def.long, `invalid argument "${value}" for ${origin}: not a duration (e.g. 5s)`);
      }
      break;
    default:
      break;
  }
  raw.strings.set(def, value);
}

function flagLabel(def: FlagDef): string {
  return def.short ? `-${def.short}, --${def.long}` : `--${def.long}`;
}

/** Parses istio-iptables' command line (pflag syntax) and environment. */
export function parseIstioIptablesArgs(argv: readonly string[], opts: ParseFlagsOptions = {}): ParsedFlags {
  const env = opts.env ?? {};
  const byLong = new Map(ISTIO_IPTABLES_FLAGS.map((d) => [d.long, d]));
  const byShort = new Map(ISTIO_IPTABLES_FLAGS.filter((d) => d.short).map((d) => [d.short as string, d]));
  const raw: RawValues = { strings: new Map() };
  const sources: FieldSources = {};

  // Environment first (flag.BindEnv / AdditionalEnv run at registration,
  // before parsing). Istio ignores the error of fs.Set, but pflag's Set has
  // stored the zero value by then: a bool "yes" is false (a port "abc" 0, a
  // duration "abc" 0; neither changes a rule).
  for (const def of ISTIO_IPTABLES_FLAGS) {
    const names = [...(def.env ? [envName(def.long)] : []), ...(def.aliases ?? [])];
    for (const n of names) {
      const v = env[n];
      if (v === undefined) continue;
      try {
        setValue(def, v, raw, `environment variable ${n}`);
      } catch (e) {
        if (!(e instanceof FlagParseError)) throw e;
        raw.strings.set(def, def.kind === 'bool' ? 'false' : '0');
        opts.onWarning?.(`${e.message}: taken as ${def.kind === 'bool' ? 'false' : '0'}, as istio-iptables does`);
      }
      if (def.field) sources[def.field] = `environment variable ${n}`;
    }
  }

  const args: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    if (a === '--') {
      args.push(...argv.slice(i + 1));
      break;
    }
    if (a.startsWith('--')) {
      const eq = a.indexOf('=');
      const name = a.slice(2, eq < 0 ? undefined : eq);
      const def = byLong.get(name);
      if (!def) throw new FlagParseError(name, `unknown flag: --${name}`);
      let value: string;
      if (eq >= 0) value = a.slice(eq + 1);
      else if (def.kind === 'bool') value = 'true';
      else {
        if (i + 1 >= argv.length) throw new FlagParseError(def.long, `flag needs an argument: --${def.long}`);
        value = argv[++i] as string;
      }
      setValue(def, value, raw, `flag ${flagLabel(def)}`);
      if (def.field) sources[def.field] = `flag ${flagLabel(def)}`;
      continue;
    }
    if (a.startsWith('-') && a.length > 1) {
      // Shorthand group: -n, -p15001, -p=15001, -p 15001, -nb '*'.
      for (let j = 1; j < a.length; j++) {
        const c = a[j] as string;
        const def = byShort.get(c);
        if (!def) throw new FlagParseError(c, `unknown shorthand flag: '${c}' in ${a}`);
        let value: string;
        const rest = a.slice(j + 1);
        // pflag: "-p=X" is X only when X is not empty; "-p=" is the value "=".
        if (def.kind === 'bool') {
          if (rest.startsWith('=') && rest.length > 1) {
            value = rest.slice(1);
            j = a.length;
          } else value = 'true';
        } else {
          if (rest.startsWith('=') && rest.length > 1) value = rest.slice(1);
          else if (rest.length > 0) value = rest;
          else {
            if (i + 1 >= argv.length) throw new FlagParseError(def.long, `flag needs an argument: '${c}' in -${c}`);
            value = argv[++i] as string;
          }
          j = a.length;
        }
        setValue(def, value, raw, `flag ${flagLabel(def)}`);
        if (def.field) sources[def.field] = `flag ${flagLabel(def)}`;
      }
      continue;
    }
    args.push(a);
  }

  const get = (long: string): string | undefined => {
    const def = byLong.get(long);
    return def ? raw.strings.get(def) : undefined;
  };
  const str = (long: string, dflt: string) => get(long) ?? dflt;
  const bool = (long: string) => {
    const v = get(long);
    return v === undefined ? false : (parseGoBool(v) as boolean);
  };

  const d = ISTIO_IPTABLES_DEFAULTS;
  // FillConfigFromEnvironment: -u defaults to ENVOY_USER's uid, else 1337; -g to -u.
  let proxyUID = str('proxy-uid', '');
  if (proxyUID === '') {
    const user = env[ENV_ENVOY_USER] ?? ISTIO_PROXY_USER;
    proxyUID = (opts.lookupUser ?? lookupUserInPasswd)(user) ?? ISTIO_DEFAULT_PROXY_UID;
  }
  const proxyGID = str('proxy-gid', '') === '' ? proxyUID : str('proxy-gid', '');

  const mode = str('istio-inbound-interception-mode', '');
  if (mode !== '' && mode !== 'REDIRECT' && mode !== 'TPROXY' && opts.onVerbatim) {
    // run.go only asks `== "TPROXY"`: anything else renders REDIRECT's rules
    opts.onVerbatim(`interception mode "${mode}" is neither REDIRECT nor TPROXY: istio-iptables renders REDIRECT's rules for it`);
  } else if (mode !== '' && mode !== 'REDIRECT' && mode !== 'TPROXY') {
    throw new CaptureConfigError('inboundInterceptionMode', sources.inboundInterceptionMode ?? 'flag -m', mode,
      'must be "REDIRECT" or "TPROXY"');
  }

  sources.ownerGroupsInclude = `environment variable ${ENV_OWNER_GROUPS_INCLUDE}`;
  sources.ownerGroupsExclude = `environment variable ${ENV_OWNER_GROUPS_EXCLUDE}`;
  sources.hostIPv4LoopbackCidr = `environment variable ${ENV_IPV4_LOOPBACK_CIDR}`;
  sources.proxyUID ??= 'flag -u, --proxy-uid';
  sources.proxyGID ??= 'flag -g, --proxy-gid';
  sources.dnsServersV4 ??= 'DNS servers (IPv4)';
  sources.dnsServersV6 ??= 'DNS servers (IPv6)';
  for (const def of ISTIO_IPTABLES_FLAGS) if (def.field) sources[def.field] ??= `flag ${flagLabel(def)}`;

  const settings: CaptureSettings = {
    proxyPort: str('envoy-port', d.proxyPort),
    inboundCapturePort: str('inbound-capture-port', d.inboundCapturePort),
    inboundTunnelPort: str('inbound-tunnel-port', d.inboundTunnelPort),
    proxyUID: splitList(proxyUID),
    proxyGID: splitList(proxyGID),
    inboundInterceptionMode: mode === 'TPROXY' ? 'TPROXY' : 'REDIRECT',
    inboundTProxyMark: str('istio-inbound-tproxy-mark', d.inboundTProxyMark),
    inboundTProxyRouteTable: str('istio-inbound-tproxy-route-table', d.inboundTProxyRouteTable),
    inboundPortsInclude: str('istio-inbound-ports', d.inboundPortsInclude),
    inboundPortsExclude: str('istio-local-exclude-ports', d.inboundPortsExclude),
    outboundPortsInclude: str('istio-outbound-ports', d.outboundPortsInclude),
    outboundPortsExclude: str('istio-local-outbound-ports-exclude', d.outboundPortsExclude),
    outboundIPRangesInclude: str('istio-service-cidr', d.outboundIPRangesInclude),
    outboundIPRangesExclude: str('istio-service-exclude-cidr', d.outboundIPRangesExclude),
    kubeVirtInterfaces: str('kube-virt-interfaces', d.kubeVirtInterfaces),
    excludeInterfaces: str('istio-exclude-interfaces', d.excludeInterfaces),
    redirectDNS: bool('redirect-dns'),
    captureAllDNS: bool('capture-all-dns'),
    dropInvalid: bool('drop-invalid'),
    dualStack: bool('dual-stack'),
    enableIPv6: opts.enableIPv6 ?? false,
    dnsServersV4: [],
    dnsServersV6: [],
    ownerGroupsInclude: env[ENV_OWNER_GROUPS_INCLUDE] ?? d.ownerGroupsInclude,
    ownerGroupsExclude: env[ENV_OWNER_GROUPS_EXCLUDE] ?? d.ownerGroupsExclude,
    hostIPv4LoopbackCidr: env[ENV_IPV4_LOOPBACK_CIDR] ?? d.hostIPv4LoopbackCidr,
  };
  // Istio only looks up nameservers when redirecting DNS without capture-all.
  if (settings.redirectDNS && !settings.captureAllDNS) {
    settings.dnsServersV4 = [...(opts.dnsServersV4 ?? [])];
    settings.dnsServersV6 = [...(opts.dnsServersV6 ?? [])];
  }

  const runtime: IstioRuntimeOptions = {
    dryRun: bool('dry-run'),
    iptablesProbePort: str('iptables-probe-port', '15002'),
    probeTimeout: str('probe-timeout', '5s'),
    skipRuleApply: bool('skip-rule-apply'),
    runValidation: bool('run-validation'),
    networkNamespace: str('network-namespace', ''),
    cniMode: bool('cni-mode'),
    reconcile: bool('reconcile'),
    cleanupOnly: bool('cleanup-only'),
    forceApply: bool('force-apply'),
    nativeNftables: bool('native-nftables'),
    forceIptablesBinary: str('force-iptables-binary', ''),
  };
  // config.ValidateIptablesBinary: "", "legacy" or "nft"
  if (!['', 'legacy', 'nft'].includes(runtime.forceIptablesBinary)) {
    throw new FlagParseError('force-iptables-binary',
      `invalid --force-iptables-binary "${runtime.forceIptablesBinary}": must be "legacy" or "nft"`);
  }

  const onVerbatim = opts.onVerbatim;
  const build = () => buildCaptureConfig(settings, sources, onVerbatim ? { onVerbatim: (e) => onVerbatim(`${e.message}; istio-iptables passes it to iptables as it is`) } : {});
  let config: CaptureConfig;
  try {
    config = build();
  } catch (e) {
    // With --skip-rule-apply istio-iptables never builds rules, so it never
    // parses the CIDR lists: a bad one fails nothing (and nothing is rendered).
    const cidrField = e instanceof CaptureConfigError && (e.field === 'outboundIPRangesInclude' || e.field === 'outboundIPRangesExclude');
    if (!(onVerbatim && runtime.skipRuleApply && cidrField)) throw e;
    onVerbatim(`${(e as Error).message}; ignored with --skip-rule-apply, as istio-iptables does`);
    settings.outboundIPRangesInclude = '';
    settings.outboundIPRangesExclude = '';
    config = build();
  }
  return { config, runtime, args };
}
