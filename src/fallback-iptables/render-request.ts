// What `meshcap iptables render` renders: its argv split into meshcap's own
// options and istio-iptables' flags (-p, -z, -u, ... in pflag syntax: -p15001,
// -p=15001, which are not commander options), the CaptureConfig they or a Pod
// manifest (--pod) describe, and the rendered text. The command itself is
// registered in src/cli/iptables-command.ts.
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import type { V1Pod } from '@kubernetes/client-node';
import { splitList, type CaptureConfig, type CaptureSettings } from '../redirect/config.js';
import { parseIstioIptablesArgs } from '../redirect/flags.js';
import { decideMeshed } from '../decision/meshed.js';
import { podShapeProblem } from '../kube/pod-shape.js';
import { podToCaptureConfig } from '../redirect/pod.js';
import { isMeshProfile, MESH_PROFILES, type MeshProfile } from '../mesh/vocabulary.js';
import { renderIptables } from './render.js';

/** The command line is wrong (exit 2, with usage). */
export class RenderUsageError extends Error {}
/** The input is valid but not renderable as asked: a non-Pod, a pod istio-cni skips (exit 1). */
export class RenderRefusedError extends Error {}

export interface RenderOptions {
  /** istio-iptables reads its environment; tests pass their own. */
  env?: Record<string, string | undefined>;
  /** Warnings Istio would log (an unparsable ISTIO_META_DNS_CAPTURE, ...). */
  warn?: (message: string) => void;
  /** `--pod -`: the manifest text on stdin. */
  readStdin?: () => string;
}

export interface RenderRequest {
  family: 4 | 6;
  pod?: string;
  profile: MeshProfile;
  /** --profile was given (it only means something with --pod). */
  profileGiven: boolean;
  /** --force: render a pod istio-cni would skip. */
  force: boolean;
  dnsServersV4: string[];
  dnsServersV6: string[];
  istioArgs: string[];
}

const OWN_FLAGS = ['--pod', '--family', '--dns-servers-v4', '--dns-servers-v6', '--profile', '--force'] as const;

/** Splits meshcap's own flags from istio-iptables' flags. */
export function parseRenderArgs(argv: readonly string[]): RenderRequest {
  const req: RenderRequest = { family: 4, profile: 'istio', profileGiven: false, force: false, dnsServersV4: [], dnsServersV6: [], istioArgs: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    const eq = a.indexOf('=');
    const name = a.startsWith('--') ? a.slice(0, eq < 0 ? undefined : eq) : '';
    if (!(OWN_FLAGS as readonly string[]).includes(name)) {
      req.istioArgs.push(a);
      continue;
    }
    if (name === '--force') {
      if (eq >= 0) throw new RenderUsageError('--force takes no value');
      req.force = true;
      continue;
    }
    let value: string;
    if (eq >= 0) value = a.slice(eq + 1);
    else {
      if (i + 1 >= argv.length) throw new RenderUsageError(`${name} needs a value`);
      value = argv[++i] as string;
    }
    switch (name) {
      case '--pod':
        req.pod = value;
        break;
      case '--family':
        if (value !== '4' && value !== '6') throw new RenderUsageError(`--family must be 4 or 6, got "${value}"`);
        req.family = Number(value) as 4 | 6;
        break;
      case '--profile':
        if (!isMeshProfile(value)) throw new RenderUsageError(`--profile must be ${MESH_PROFILES.join(' or ')}, got "${value}"`);
        req.profile = value;
        req.profileGiven = true;
        break;
      case '--dns-servers-v4':
        req.dnsServersV4 = splitList(value);
        break;
      case '--dns-servers-v6':
        req.dnsServersV6 = splitList(value);
        break;
    }
  }
  if (req.pod !== undefined && req.istioArgs.length > 0) {
    const flags = req.istioArgs.filter((a) => a.startsWith('-'));
    throw new RenderUsageError(flags.length > 0
      ? `--pod cannot be combined with istio-iptables flags (${req.istioArgs.join(' ')})`
      : `unexpected argument(s) ${req.istioArgs.map((a) => JSON.stringify(a)).join(' ')}: render takes no positional arguments`);
  }
  if (req.pod === undefined && req.profileGiven) {
    throw new RenderUsageError('--profile only applies to --pod FILE (istio-iptables flags describe the rules themselves)');
  }
  if (req.pod === undefined && req.force) throw new RenderUsageError('--force only applies to --pod FILE');
  return req;
}

/** One Pod from a YAML or JSON file (`-` = stdin), its field types checked. */
export function loadPodManifest(path: string, readStdin: () => string = () => readFileSync(0, 'utf8')): V1Pod {
  const label = path === '-' ? 'stdin' : path;
  let text: string;
  try {
    text = path === '-' ? readStdin() : readFileSync(path, 'utf8');
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    throw new RenderRefusedError(`cannot read pod manifest ${label}: ${err.code === 'ENOENT' ? 'no such file' : err.message}`);
  }
  let doc: unknown;
  try {
    doc = parseYaml(text, { prettyErrors: true }); // YAML is a superset of JSON
  } catch (e) {
    throw new RenderRefusedError(`${label} is not valid YAML or JSON: ${(e as Error).message.split('\n')[0]}`);
  }
  if (doc === null || doc === undefined) throw new RenderRefusedError(`${label} is empty: expected a Pod manifest`);
  if (typeof doc !== 'object' || Array.isArray(doc)) throw new RenderRefusedError(`${label} is not a Pod manifest (expected a mapping with kind: Pod)`);
  const kind = (doc as { kind?: unknown }).kind;
  if (kind !== undefined && kind !== 'Pod') {
    const hint = kind === 'Deployment' || kind === 'StatefulSet' || kind === 'DaemonSet' || kind === 'Job'
      ? ' (render one of its pods: `kubectl get pod NAME -o yaml`)' : '';
    throw new RenderRefusedError(`${label} is a ${typeof kind === 'string' ? kind : JSON.stringify(kind)}, not a Pod${hint}`);
  }
  if (kind === undefined && !('spec' in doc)) throw new RenderRefusedError(`${label} is not a Pod manifest: it has neither kind: Pod nor a spec`);
  const problem = podShapeProblem(doc);
  if (problem) throw new RenderRefusedError(`${label}: ${problem}`);
  return doc as V1Pod;
}

/** Ports istio-iptables passes to iptables as they are: 8000-8010 is not a port iptables knows. */
const PORT_LIST_FIELDS: readonly (keyof CaptureSettings)[] = ['inboundPortsInclude', 'inboundPortsExclude', 'outboundPortsInclude', 'outboundPortsExclude'];

/** Port values iptables-restore will not take: istio-iptables renders them anyway, so meshcap warns. */
function checkIptablesPorts(config: CaptureConfig, warn: (m: string) => void): void {
  const sources = flagSources;
  for (const field of PORT_LIST_FIELDS) {
    const value = config[field] as string;
    if (value === '*') continue;
    for (const tok of splitList(value)) {
      if (/^[0-9]+(:[0-9]+)?$/.test(tok.trim())) continue;
      const range = /^\s*([0-9]+)\s*-\s*([0-9]+)\s*$/.exec(tok);
      warn(
        `${sources[field] ?? field} "${value}": ` +
        (range
          ? `istio-iptables passes "${tok}" to iptables as --dport ${tok}, which iptables-restore rejects (a range is ${range[1]}:${range[2]} in iptables), so applying these rules fails; list the ports or write the range as ${range[1]}:${range[2]}`
          : `"${tok}" is not a port number: iptables-restore takes it only if it names a service in /etc/services`),
      );
      break;
    }
  }
}

const flagSources: Partial<Record<keyof CaptureSettings, string>> = {
  inboundPortsInclude: 'flag -b, --istio-inbound-ports',
  inboundPortsExclude: 'flag -d, --istio-local-exclude-ports',
  outboundPortsInclude: 'flag -q, --istio-outbound-ports',
  outboundPortsExclude: 'flag -o, --istio-local-outbound-ports-exclude',
};

/** The CaptureConfig a render request describes. */
export function captureConfigForRender(req: RenderRequest, opts: RenderOptions = {}): CaptureConfig {
  return renderInput(req, opts).config;
}

/**
 * The config, and whether istio-iptables would feed iptables-restore at all:
 * --skip-rule-apply and --cleanup-only make it apply no rules, so their
 * render is empty.
 */
function renderInput(req: RenderRequest, opts: RenderOptions): { config: CaptureConfig; appliesRules: boolean } {
  const enableIPv6 = req.family === 6;
  const warn = opts.warn ?? (() => {});
  if (req.pod !== undefined) {
    const pod = loadPodManifest(req.pod, opts.readStdin);
    const label = req.pod === '-' ? 'the pod on stdin' : `pod ${req.pod}`;
    const decision = decideMeshed(pod);
    if (!decision.meshed && !req.force) {
      throw new RenderRefusedError(`istio-cni and meshcap would not redirect ${label}: ${decision.reason}; --force renders it anyway`);
    }
    if (!decision.meshed) warn(`${label} would not be redirected (${decision.reason}); rendering it anyway (--force)`);
    else if (decision.profile !== req.profile) {
      warn(`${label} looks like a ${decision.profile} pod; rendering it with --profile ${req.profile}${req.profileGiven ? '' : ' (the default)'}`);
    }
    return { config: podToCaptureConfig(pod, req.profile, { enableIPv6, onWarning: warn }), appliesRules: true };
  }
  // istio-iptables rejects only what it parses itself (flags, CIDRs, owner
  // groups, the loopback CIDR, the iptables binary); everything else it hands
  // to iptables as it is, and so does the render, with a warning.
  const { config, runtime, args } = parseIstioIptablesArgs(req.istioArgs, {
    env: opts.env ?? process.env, enableIPv6, dnsServersV4: req.dnsServersV4, dnsServersV6: req.dnsServersV6,
    onVerbatim: warn, onWarning: warn,
  });
  if (args.length > 0) {
    const file = args.find((a) => /\.(ya?ml|json)$/i.test(a));
    throw new RenderUsageError(
      `unexpected argument(s) ${args.map((a) => JSON.stringify(a)).join(' ')}: render takes flags only${file ? ` (did you mean --pod ${file}?)` : ''}`,
    );
  }
  if (runtime.nativeNftables) throw new RenderUsageError('--native-nftables: meshcap renders iptables rules only');
  checkIptablesPorts(config, warn);
  const appliesRules = !runtime.skipRuleApply && !runtime.cleanupOnly;
  if (!appliesRules) warn(`${runtime.skipRuleApply ? '--skip-rule-apply' : '--cleanup-only'}: istio-iptables feeds iptables-restore nothing, so there is nothing to print`);
  return { config, appliesRules };
}

/** Rendered text for the requested family. */
export function renderForArgs(argv: readonly string[], env: Record<string, string | undefined> = process.env, opts: Omit<RenderOptions, 'env'> = {}): string {
  const req = parseRenderArgs(argv);
  const { config, appliesRules } = renderInput(req, { ...opts, env });
  if (!appliesRules) return '';
  const out = renderIptables(config);
  return req.family === 6 ? (out.v6 ?? '') : out.v4;
}
