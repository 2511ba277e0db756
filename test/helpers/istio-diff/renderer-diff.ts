// The renderer differential: each generated istio-iptables invocation runs
// through the real istio-iptables (dry run, in a namespace of the case's
// family) and through meshcap's render (the library function behind
// `meshcap iptables render`, in-process). Same restore input per family, byte
// for byte, or both reject it. Istio's dry run accepts values only
// iptables-restore rejects (ports like 8000-8010): when meshcap rejects what
// the dry run accepted, the kernel's iptables-restore --test decides whether
// the real istio-iptables would have failed too.
import fc from 'fast-check';
import { isIP } from 'node:net';
import { renderForArgs } from '../../../src/fallback-iptables/render-request.js';
import { parseIstioIptablesArgs } from '../../../src/redirect/flags.js';
import { iptablesAccepts, runIstioIptables, type PeerNetns, type RestoreInputs } from '../istio-peers.js';
import { flagCase, resolvConf, type FlagCase } from './flag-cases.js';

export type MeshcapOutcome = ({ ok: true } & RestoreInputs) | { ok: false; error: string };

/** meshcap's answer to a case: what `meshcap iptables render` prints per family, or its refusal. */
export function meshcapRender(c: FlagCase): MeshcapOutcome {
  try {
    // Istio detects IPv6 from the namespace's addresses (getLocalIP: the first
    // non-loopback address decides, and the kernel lists IPv4 first; with
    // dual stack any IPv6 address does); meshcap is told (--family).
    const { config } = parseIstioIptablesArgs(c.args, { env: c.env, onVerbatim: () => {}, onWarning: () => {} });
    const ipv6 = c.family === 'v6' || (c.family === 'dual' && config.dualStack);
    // meshcap does not read /etc/resolv.conf: the servers are passed as Istio splits them
    const servers = config.redirectDNS && !config.captureAllDNS ? c.nameservers : [];
    const dns = [`--dns-servers-v4=${servers.filter((s) => isIP(s) === 4).join(',')}`, `--dns-servers-v6=${servers.filter((s) => isIP(s) === 6).join(',')}`];
    const v4 = renderForArgs([...c.args, ...dns, '--family', '4'], c.env);
    const v6 = ipv6 ? renderForArgs([...c.args, ...dns, '--family', '6'], c.env) : null;
    return { ok: true, v4, v6 };
  } catch (e) {
    return { ok: false, error: (e as Error).message };
  }
}

export interface CaseResult {
  index: number;
  input: FlagCase;
  identical: boolean;
  /** Why they differ, or how they agreed on a rejection. */
  detail: string;
  istio: { status: number; error: string } & RestoreInputs;
  meshcap: MeshcapOutcome;
}

/** One case through both; `netns` holds the family namespaces. */
export async function diffCase(index: number, c: FlagCase, netns: PeerNetns, workDir: string): Promise<CaseResult> {
  // istio-iptables reads /etc/resolv.conf only when DNS redirection is asked for
  const needsResolv = c.args.some((a) => a.startsWith('--redirect-dns')) || 'REDIRECT_DNS' in c.env || 'ISTIO_META_DNS_CAPTURE' in c.env;
  const istio = await runIstioIptables({ args: c.args, env: c.env, netns: netns.path[c.family], resolvConf: needsResolv ? resolvConf(c) : undefined }, workDir);
  const meshcap = meshcapRender(c);
  const base = { index, input: c, istio, meshcap };
  if (istio.status !== 0 && !meshcap.ok) return { ...base, identical: true, detail: `both reject: istio (exit ${istio.status}) ${istio.error} | meshcap: ${meshcap.error}` };
  if (istio.status !== 0 && meshcap.ok) return { ...base, identical: false, detail: `istio-iptables exits ${istio.status} (${istio.error}); meshcap renders` };
  if (!meshcap.ok) {
    // Istio's dry run printed rules; would iptables-restore have taken them?
    for (const [fam, text] of [[4, istio.v4], [6, istio.v6]] as const) {
      if (text === null) continue;
      const r = await iptablesAccepts(text, fam, netns.scratch);
      if (!r.ok) return { ...base, identical: true, detail: `both reject: istio-iptables' rules fail in ${fam === 4 ? 'iptables' : 'ip6tables'}-restore (${r.message.split('\n')[0]}) | meshcap: ${meshcap.error}` };
    }
    return { ...base, identical: false, detail: `meshcap rejects (${meshcap.error}); istio-iptables renders rules iptables-restore accepts` };
  }
  // no restore run (--skip-rule-apply, --cleanup-only, no IPv6): nothing to feed, ''
  if ((istio.v4 ?? '') !== meshcap.v4) return { ...base, identical: false, detail: `IPv4 rules differ:\n${lineDiff(istio.v4 ?? '', meshcap.v4 ?? '')}` };
  if ((istio.v6 ?? '') !== (meshcap.v6 ?? '')) return { ...base, identical: false, detail: `IPv6 rules differ (istio ${istio.v6 === null ? 'renders none' : 'renders'}, meshcap ${meshcap.v6 === null ? 'renders none' : 'renders'}):\n${lineDiff(istio.v6 ?? '', meshcap.v6 ?? '')}` };
  return { ...base, identical: true, detail: 'identical' };
}

/** A short line diff: the first differing line and its neighbourhood. */
export function lineDiff(istio: string, meshcap: string): string {
  const a = istio.split('\n');
  const b = meshcap.split('\n');
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  const around = (l: string[]) => l.slice(Math.max(0, i - 2), i + 3).map((x, k) => `${Math.max(0, i - 2) + k + 1}: ${x}`).join('\n    ');
  return `  first difference at line ${i + 1}\n  istio:\n    ${around(a)}\n  meshcap:\n    ${around(b)}`;
}

export interface DiffSummary {
  cases: number;
  identical: number;
  differ: number;
  /** The differing cases (all of them). */
  differences: CaseResult[];
  /** Cases both rejected. */
  bothRejected: number;
  ms: number;
}

/** The generated cases for a seed (fast-check's own generator, reproducible). */
export function generateFlagCases(seed: number, runs: number): FlagCase[] {
  return fc.sample(flagCase, { seed, numRuns: runs });
}

/** Runs `cases` through both, `concurrency` at a time. */
export async function runFlagDiff(cases: readonly FlagCase[], netns: PeerNetns, workDir: string, concurrency = 2, onResult?: (r: CaseResult) => void): Promise<DiffSummary> {
  const start = Date.now();
  const summary: DiffSummary = { cases: 0, identical: 0, differ: 0, differences: [], bothRejected: 0, ms: 0 };
  let next = 0;
  const worker = async () => {
    while (next < cases.length) {
      const i = next++;
      const r = await diffCase(i, cases[i] as FlagCase, netns, workDir);
      summary.cases++;
      if (r.identical) {
        summary.identical++;
        if (!r.meshcap.ok) summary.bothRejected++;
      } else {
        summary.differ++;
        summary.differences.push(r);
      }
      onResult?.(r);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  summary.differences.sort((x, y) => x.index - y.index);
  summary.ms = Date.now() - start;
  return summary;
}

/** How a case is written down, to reproduce it by hand or keep it as a vector. */
export function describeCase(c: FlagCase): string {
  const env = Object.entries(c.env).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(' ');
  return `${env ? `${env} ` : ''}istio-iptables ${c.args.map((a) => (/^[\w\-=.,:/*]+$/.test(a) ? a : JSON.stringify(a))).join(' ')}  [netns ${c.family}${c.nameservers.length ? `, nameservers ${c.nameservers.join(' ')}` : ''}]`;
}
