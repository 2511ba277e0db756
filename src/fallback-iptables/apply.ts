// Apply / remove / check the istio-iptables rules inside a pod's network
// namespace (a path such as /var/run/netns/<name> or /proc/<pid>/ns/net).
//
// - Binary: chosen per family the way Istio's DetectIptablesVersion does —
//   legacy if the netns already holds legacy rules, else nft, else plain
//   `iptables`; an override wins.
// - Lock: iptables-legacy serialises on /run/xtables.lock, which is the HOST's
//   lock file even inside a pod netns (same mount namespace), so a busy host
//   (kube-proxy) would stall pod setup. Istio bind-mounts a per-pod file over
//   it; libxtables honours XTABLES_LOCKFILE, which gives the same per-pod lock
//   without a mount namespace. iptables-nft takes no xtables lock at all (the
//   kernel commits each nft batch atomically per netns).
// - Atomic re-apply: one iptables-restore --noflush per family deletes the
//   previous jumps/chains and creates the new ones in the same transaction.
// - Rules are compared in the kernel's canonical form: the rendered text is
//   round-tripped through iptables-restore/-save in a throwaway netns
//   (`unshare --net`), because iptables-save reorders matches and prints marks
//   in hex.
import { createHash } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { execa } from 'execa';
import { pino, type Logger } from 'pino';
import { addPassthroughV6 } from '../pod-netns.js';
import type { CaptureConfig } from '../redirect/config.js';
import { renderIptables } from './render.js';
import {
  BUILTIN_CHAINS,
  joinRestore,
  MESHCAP_CHAIN_PREFIX,
  parseSave,
  ruleTarget,
  splitRestore,
  type SavedState,
} from './savefile.js';

export type IptablesVariant = 'legacy' | 'nft' | 'plain';
export type Family = 4 | 6;

export interface IptablesOptions {
  /** Skip detection (Istio's --force-iptables-binary). */
  forceVariant?: IptablesVariant;
  /** Directory for per-netns xtables lock files. */
  lockDir?: string;
  logger?: Logger;
}

export class IptablesExecError extends Error {
  constructor(
    readonly netns: string,
    readonly binary: string,
    readonly exitCode: number | undefined,
    readonly stderr: string,
  ) {
    super(`${binary} in netns ${netns} failed (exit code ${exitCode ?? 'none'}): ${stderr.trim() || '(no stderr)'}`);
    this.name = 'IptablesExecError';
  }
}

const DEFAULT_LOCK_DIR = '/run/meshcap/xtables';
let defaultLogger: Logger | undefined;
const log = (o: IptablesOptions) => o.logger ?? (defaultLogger ??= pino({ name: 'meshcap-fallback-iptables' }));

export function binaryName(variant: IptablesVariant, family: Family, tool: '' | '-save' | '-restore'): string {
  const base = family === 4 ? 'iptables' : 'ip6tables';
  return variant === 'plain' ? `${base}${tool}` : `${base}-${variant}${tool}`;
}

function lockFileFor(netns: string, o: IptablesOptions): string {
  const dir = o.lockDir ?? DEFAULT_LOCK_DIR;
  mkdirSync(dir, { recursive: true });
  return join(dir, `${createHash('sha256').update(netns).digest('hex').slice(0, 16)}.lock`);
}

async function inNetns(netns: string, argv: string[], o: IptablesOptions, input?: string): Promise<string> {
  const r = await execa('nsenter', [`--net=${netns}`, ...argv], {
    input,
    reject: false,
    env: { XTABLES_LOCKFILE: lockFileFor(netns, o) },
  });
  if (r.exitCode !== 0) throw new IptablesExecError(netns, argv.join(' '), r.exitCode, `${r.stderr}`);
  return r.stdout;
}

/** The rules live in a pod's netns, as its iptables(-legacy)-save prints them (for explain). */
export async function liveRules(netns: string, family: Family, o: IptablesOptions = {}): Promise<string> {
  const variant = await detectVariant(netns, family, o);
  return inNetns(netns, [binaryName(variant, family, '-save')], o);
}

/** Istio's choice: legacy if that netns already has legacy rules, else nft, else plain. */
export async function detectVariant(netns: string, family: Family, o: IptablesOptions = {}): Promise<IptablesVariant> {
  if (o.forceVariant) return o.forceVariant;
  try {
    const legacy = parseSave(await inNetns(netns, [binaryName('legacy', family, '-save')], o));
    if (hasAnyRules(legacy)) return 'legacy';
  } catch {
    // No legacy binary or no legacy tables: not legacy.
  }
  return (nftPresent[family] ??= execa(binaryName('nft', family, ''), ['--version']).then(() => 'nft' as const, () => 'plain' as const));
}
// Whether the node has the nft binaries does not change while the agent runs.
const nftPresent: Partial<Record<Family, Promise<'nft' | 'plain'>>> = {};

function hasAnyRules(s: SavedState): boolean {
  for (const t of s.values()) {
    if (t.rules.length > 0) return true;
    for (const c of t.chains.keys()) if (!BUILTIN_CHAINS.has(c)) return true;
  }
  return false;
}

// Pods of one profile render the same text: the canonical form (a throwaway
// netns and two execs) is computed once per distinct text, not once per ADD.
const CANONICAL_CACHE_MAX = 64;
const canonicalCache = new Map<string, SavedState>();

/** Rendered rules in iptables-save's canonical form, via a throwaway netns (memoized). */
export async function canonicalize(restoreText: string, variant: IptablesVariant, family: Family, o: IptablesOptions = {}): Promise<SavedState> {
  if (restoreText === '') return new Map();
  const key = `${variant}\0${family}\0${restoreText}`;
  const hit = canonicalCache.get(key);
  if (hit) return hit;
  const state = await canonicalizeUncached(restoreText, variant, family, o);
  if (canonicalCache.size >= CANONICAL_CACHE_MAX) canonicalCache.delete(canonicalCache.keys().next().value!);
  canonicalCache.set(key, state);
  return state;
}

async function canonicalizeUncached(restoreText: string, variant: IptablesVariant, family: Family, o: IptablesOptions): Promise<SavedState> {
  const restore = binaryName(variant, family, '-restore');
  const save = binaryName(variant, family, '-save');
  // Binary names come from a fixed table; the rules go through stdin.
  const r = await execa('unshare', ['--net', 'sh', '-c', `${restore} --noflush && ${save}`], {
    input: restoreText,
    reject: false,
    env: { XTABLES_LOCKFILE: lockFileFor('(scratch)', o) },
  });
  if (r.exitCode !== 0) throw new IptablesExecError('(scratch netns)', restore, r.exitCode, r.stderr);
  return parseSave(r.stdout);
}

const isMeshcapChain = (c: string) => c.startsWith(MESHCAP_CHAIN_PREFIX);

/** Builtin-chain rules a config adds (canonical), per table. */
function builtinRules(expected: SavedState): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const [t, tab] of expected) {
    out.set(t, tab.rules.filter((r) => BUILTIN_CHAINS.has(r.chain)).map((r) => `${r.chain} ${r.spec}`));
  }
  return out;
}

/** restore lines removing meshcap's chains, jumps to them and (if known) its builtin-chain rules. */
function removalLines(live: SavedState, expected?: SavedState): Map<string, string[]> {
  const exp = expected ? builtinRules(expected) : new Map<string, string[]>();
  const out = new Map<string, string[]>();
  for (const [t, tab] of live) {
    const mine = [...tab.chains.keys()].filter(isMeshcapChain);
    const ours = new Set(exp.get(t) ?? []);
    const del = tab.rules
      .filter((r) => !isMeshcapChain(r.chain))
      .filter((r) => isMeshcapChain(ruleTarget(r.spec) ?? '') || ours.has(`${r.chain} ${r.spec}`))
      .map((r) => `-D ${r.chain} ${r.spec}`);
    const lines = [...del, ...mine.map((c) => `-F ${c}`), ...mine.map((c) => `-X ${c}`)];
    if (lines.length > 0) out.set(t, lines);
  }
  return out;
}

function families(config?: CaptureConfig): Family[] {
  return config === undefined || config.enableIPv6 ? [4, 6] : [4];
}

export interface ApplyResult {
  variants: Partial<Record<Family, IptablesVariant>>;
  restoreInput: Partial<Record<Family, string>>;
}

/** Programs the rules (replacing any previous copy) and Istio's routes for TPROXY / IPv6. */
export async function applyCapture(netns: string, config: CaptureConfig, o: IptablesOptions = {}): Promise<ApplyResult> {
  const rendered = renderIptables(config);
  const result: ApplyResult = { variants: {}, restoreInput: {} };
  for (const fam of families(config)) {
    const text = fam === 4 ? rendered.v4 : (rendered.v6 ?? '');
    const variant = await detectVariant(netns, fam, o);
    const expected = await canonicalize(text, variant, fam, o);
    const live = parseSave(await inNetns(netns, [binaryName(variant, fam, '-save')], o));
    const tables = removalLines(live, expected);
    for (const [t, lines] of splitRestore(text)) tables.set(t, [...(tables.get(t) ?? []), ...lines]);
    const input = joinRestore(tables);
    await inNetns(netns, [binaryName(variant, fam, '-restore'), '--noflush'], o, input);
    result.variants[fam] = variant;
    result.restoreInput[fam] = input;
  }
  await configureRoutes(netns, config, o);
  log(o).info({ netns, variants: result.variants, ipv6: config.enableIPv6, mode: config.inboundInterceptionMode }, 'iptables capture applied');
  return result;
}

/**
 * Removes meshcap's (ISTIO_*) chains and every jump to them; with the config
 * that was applied, also its rules in built-in chains (TPROXY marks, interface
 * RETURNs). Anything else in the netns is left alone.
 */
export async function removeCapture(netns: string, config?: CaptureConfig, o: IptablesOptions = {}): Promise<void> {
  const rendered = config ? renderIptables(config) : undefined;
  for (const fam of families(config)) {
    const variant = await detectVariant(netns, fam, o);
    let liveText: string;
    try {
      liveText = await inNetns(netns, [binaryName(variant, fam, '-save')], o);
    } catch (e) {
      if (fam === 6 && !config) continue; // no IPv6 tables there at all
      throw e;
    }
    const expected = rendered ? await canonicalize(fam === 4 ? rendered.v4 : (rendered.v6 ?? ''), variant, fam, o) : undefined;
    const input = joinRestore(removalLines(parseSave(liveText), expected));
    if (input !== '') await inNetns(netns, [binaryName(variant, fam, '-restore'), '--noflush'], o, input);
  }
  if (config) await removeRoutes(netns, config, o);
  log(o).info({ netns }, 'iptables capture removed');
}

export interface CheckResult {
  ok: boolean;
  /** Human-readable differences, e.g. "missing rule: -t nat -A ISTIO_OUTPUT ...". */
  differences: string[];
}

/** Compares the live rules (iptables-save in the netns) with the rendered ones. */
export async function checkCapture(netns: string, config: CaptureConfig, o: IptablesOptions = {}): Promise<CheckResult> {
  const rendered = renderIptables(config);
  const differences: string[] = [];
  for (const fam of families(config)) {
    const variant = await detectVariant(netns, fam, o);
    const expected = await canonicalize(fam === 4 ? rendered.v4 : (rendered.v6 ?? ''), variant, fam, o);
    const live = parseSave(await inNetns(netns, [binaryName(variant, fam, '-save')], o));
    differences.push(...diffStates(live, expected).map((d) => `IPv${fam}: ${d}`));
  }
  if (differences.length > 0) log(o).warn({ netns, differences }, 'iptables capture drifted');
  return { ok: differences.length === 0, differences };
}

/** Differences between a live dump and the expected (canonical) rules. */
export function diffStates(live: SavedState, expected: SavedState): string[] {
  const out: string[] = [];
  const tables = new Set([...live.keys(), ...expected.keys()]);
  for (const t of [...tables].sort()) {
    const L = live.get(t) ?? { chains: new Map(), rules: [] };
    const E = expected.get(t) ?? { chains: new Map(), rules: [] };
    const rulesOf = (s: typeof L, c: string) => s.rules.filter((r) => r.chain === c).map((r) => r.spec);
    const fmt = (c: string, spec: string) => `-t ${t} -A ${c} ${spec}`.trimEnd();
    const chains = new Set([...[...L.chains.keys()].filter(isMeshcapChain), ...[...E.chains.keys()].filter(isMeshcapChain)]);
    for (const c of [...chains].sort()) {
      if (!E.chains.has(c)) {
        out.push(`unexpected chain: -t ${t} ${c}`);
        continue;
      }
      if (!L.chains.has(c)) {
        out.push(`missing chain: -t ${t} ${c}`);
        continue;
      }
      const lr = rulesOf(L, c);
      const er = rulesOf(E, c);
      for (const r of er) if (!lr.includes(r)) out.push(`missing rule: ${fmt(c, r)}`);
      for (const r of lr) if (!er.includes(r)) out.push(`unexpected rule: ${fmt(c, r)}`);
      if (lr.length === er.length && lr.every((r) => er.includes(r)) && lr.join('\n') !== er.join('\n')) {
        out.push(`rule order differs in -t ${t} ${c}`);
      }
    }
    for (const c of BUILTIN_CHAINS) {
      const lr = rulesOf(L, c);
      const er = rulesOf(E, c);
      for (const r of new Set(er)) {
        const n = lr.filter((x) => x === r).length;
        if (n === 0) out.push(`missing rule: ${fmt(c, r)}`);
        else if (n > er.filter((x) => x === r).length) out.push(`duplicate rule (${n} copies): ${fmt(c, r)}`);
      }
      for (const r of lr) {
        if (!er.includes(r) && isMeshcapChain(ruleTarget(r) ?? '')) out.push(`unexpected rule: ${fmt(c, r)}`);
      }
    }
  }
  return out;
}

// --- routes (tools/common/tproxy ConfigureRoutes) ----------------------------

async function ip(netns: string, args: string[], o: IptablesOptions): Promise<string> {
  return inNetns(netns, ['ip', ...args], o);
}

async function deleteAll(netns: string, args: string[], o: IptablesOptions): Promise<void> {
  // Bounded: a rule added twice needs two deletes; stop at the first failure.
  for (let i = 0; i < 16; i++) {
    try {
      await ip(netns, args, o);
    } catch {
      return;
    }
  }
}

function tproxyRoutesWanted(config: CaptureConfig): boolean {
  return config.inboundPortsInclude !== '' && config.inboundInterceptionMode === 'TPROXY';
}

/** ::6/128 on lo for IPv6; for TPROXY fwmark <mark> -> table <table>, local default via lo. */
export async function configureRoutes(netns: string, config: CaptureConfig, o: IptablesOptions = {}): Promise<void> {
  if (config.enableIPv6) await addPassthroughV6(netns);
  if (!tproxyRoutesWanted(config)) return;
  const mark = config.inboundTProxyMark;
  const table = config.inboundTProxyRouteTable;
  for (const fam of families(config)) {
    const f = fam === 4 ? '-4' : '-6';
    await deleteAll(netns, [f, 'rule', 'del', 'fwmark', mark, 'lookup', table], o);
    await ip(netns, [f, 'rule', 'add', 'fwmark', mark, 'lookup', table], o);
    await ip(netns, [f, 'route', 'replace', 'local', 'default', 'dev', 'lo', 'table', table], o);
  }
}

async function removeRoutes(netns: string, config: CaptureConfig, o: IptablesOptions): Promise<void> {
  if (!tproxyRoutesWanted(config)) return;
  for (const fam of families(config)) {
    const f = fam === 4 ? '-4' : '-6';
    await deleteAll(netns, [f, 'rule', 'del', 'fwmark', config.inboundTProxyMark, 'lookup', config.inboundTProxyRouteTable], o);
    await deleteAll(netns, [f, 'route', 'del', 'local', 'default', 'dev', 'lo', 'table', config.inboundTProxyRouteTable], o);
  }
}
