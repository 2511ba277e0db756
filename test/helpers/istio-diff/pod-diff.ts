// The meshed-pod differential: each generated pod through istio-cni's own ADD
// path (istio-cni-decide: namespace exclusion, the meshed-pod tests,
// NewRedirect, the rules in dry-run in a namespace with the pod's addresses)
// and through meshcap's (namespaceExclusion, decideAdd as the agent calls it
// in iptables mode, renderIptables). Same decision, by category, and for
// redirected pods the same rules byte for byte.
import fc from 'fast-check';
import { decideAdd } from '../../../src/decision/add.js';
import { decideMeshed, namespaceExclusion } from '../../../src/decision/meshed.js';
import { renderIptables } from '../../../src/fallback-iptables/render.js';
import { iptablesAccepts, type CniAnswer, type IstioCniDecider, type PeerNetns, type RestoreInputs } from '../istio-peers.js';
import { lineDiff } from './renderer-diff.js';
import { podCase, type PodCase } from './pod-cases.js';

/** Why a pod is or is not redirected, in istio-cni's terms. */
export type Category =
  | 'redirect' | 'namespace-excluded' | 'istio-init' | 'disable-envoy' | 'no-istio-proxy'
  | 'proxy-type' | 'inject-disabled' | 'not-injected' | 'error' | 'unknown';

/** istio-cni's log line for each skip (cni/pkg/plugin/plugin.go doAddRun). */
const ISTIO_REASONS: Array<[RegExp, Category]> = [
  [/^pod namespace \S+ excluded$/, 'namespace-excluded'],
  [/^excluded due to being already injected with istio-init container$/, 'istio-init'],
  [/^excluded due to DISABLE_ENVOY on istio-proxy$/, 'disable-envoy'],
  [/^excluded because it does not have istio-proxy container/, 'no-istio-proxy'],
  [/^excluded \S+ pod because it has proxy type /, 'proxy-type'],
  [/^excluded due to inject-disabled annotation$/, 'inject-disabled'],
  [/^excluded due to not containing sidecar annotation$/, 'not-injected'],
];

export function istioCategory(a: CniAnswer): { category: Category; detail: string } {
  if (a.error) return { category: 'error', detail: a.error };
  if (a.programmed) return { category: 'redirect', detail: 'programmed' };
  for (const l of a.log) for (const [re, c] of ISTIO_REASONS) if (re.test(l.msg)) return { category: c, detail: l.msg };
  return { category: 'unknown', detail: a.log.map((l) => l.msg).join(' | ') || '(no log)' };
}

/** meshcap's reasons (src/decision/meshed.ts) in istio-cni's categories. */
const MESHCAP_REASONS: Array<[RegExp, Category]> = [
  [/^istio-init init container present/, 'istio-init'],
  [/^DISABLE_ENVOY=/, 'disable-envoy'],
  // an ambient pod without a sidecar, and any pod without istio-proxy: istio-cni (sidecar) sees no istio-proxy
  [/^no istio-proxy( or linkerd-proxy)? container|ambient mode/, 'no-istio-proxy'],
  [/runs as proxy type/, 'proxy-type'],
  [/disables injection$/, 'inject-disabled'],
  [/^annotation sidecar\.istio\.io\/status is missing/, 'not-injected'],
  // linkerd's own skips: to istio-cni these are pods without istio-proxy
  [/^linkerd-init init container present|^no linkerd-proxy container|linkerd\.io\/inject=disabled/, 'no-istio-proxy'],
];

export type MeshcapPodOutcome = { category: Category; detail: string } & Partial<RestoreInputs>;

export function meshcapPod(c: PodCase): MeshcapPodOutcome {
  const ns = namespaceExclusion(c.namespace, { excludeNamespaces: c.excludeNamespaces });
  if (ns) return { category: 'namespace-excluded', detail: ns };
  const m = decideMeshed(c.pod);
  if (!m.meshed) {
    for (const [re, cat] of MESHCAP_REASONS) if (re.test(m.reason)) return { category: cat, detail: m.reason };
    return { category: 'unknown', detail: m.reason };
  }
  // a Linkerd pod is meshed by meshcap's linkerd profile; istio-cni sees no istio-proxy
  if (m.profile === 'linkerd') return { category: 'no-istio-proxy', detail: 'meshed by the linkerd profile' };
  try {
    const d = decideAdd(c.pod, { nodeMode: 'iptables', prevResult: { cniVersion: '1.0.0', ips: c.podIPs.map((a) => ({ address: `${a}/${a.includes(':') ? 64 : 24}` })) } });
    if (d.kind === 'skip') return { category: 'unknown', detail: d.reason };
    const r = renderIptables(d.config);
    return { category: 'redirect', detail: 'capture', v4: r.v4, v6: r.v6 };
  } catch (e) {
    return { category: 'error', detail: (e as Error).message };
  }
}

export interface PodResult {
  index: number;
  input: PodCase;
  identical: boolean;
  detail: string;
  istio: { category: Category; detail: string };
  meshcap: MeshcapPodOutcome;
}

export async function diffPod(index: number, c: PodCase, decider: IstioCniDecider, netns: PeerNetns): Promise<PodResult> {
  const a = await decider.decide({ namespace: c.namespace, name: 'p', pod: c.pod, netns: netns.path[c.family], excludeNamespaces: c.excludeNamespaces });
  const istio = istioCategory(a);
  const meshcap = meshcapPod(c);
  const base = { index, input: c, istio, meshcap };
  if (istio.category === 'redirect' && meshcap.category === 'error') {
    // istio-cni's dry run took the annotation; would iptables-restore, and so its ADD?
    for (const [fam, text] of [[4, a.v4], [6, a.v6]] as const) {
      if (text === null) continue;
      const r = await iptablesAccepts(text, fam, netns.scratch);
      if (!r.ok) return { ...base, identical: true, detail: `both fail the ADD: istio-cni's rules fail in iptables-restore (${r.message.split('\n')[0]}) | meshcap: ${meshcap.detail}` };
    }
  }
  if (istio.category !== meshcap.category) return { ...base, identical: false, detail: `istio-cni: ${istio.category} (${istio.detail}) | meshcap: ${meshcap.category} (${meshcap.detail})` };
  if (istio.category === 'redirect') {
    if ((a.v4 ?? '') !== (meshcap.v4 ?? '')) return { ...base, identical: false, detail: `IPv4 rules differ:\n${lineDiff(a.v4 ?? '', meshcap.v4 ?? '')}` };
    if ((a.v6 ?? '') !== (meshcap.v6 ?? '')) return { ...base, identical: false, detail: `IPv6 rules differ (istio-cni ${a.v6 === null ? 'renders none' : 'renders'}, meshcap ${meshcap.v6 ? 'renders' : 'renders none'}):\n${lineDiff(a.v6 ?? '', meshcap.v6 ?? '')}` };
  }
  return { ...base, identical: true, detail: istio.category };
}

export function generatePodCases(seed: number, runs: number): PodCase[] {
  return fc.sample(podCase, { seed, numRuns: runs });
}

export interface PodSummary {
  cases: number;
  identical: number;
  differ: number;
  differences: PodResult[];
  /** How many pods landed in each category (both agree on it). */
  categories: Partial<Record<Category, number>>;
  ms: number;
}

export async function runPodDiff(cases: readonly PodCase[], decider: IstioCniDecider, netns: PeerNetns): Promise<PodSummary> {
  const start = Date.now();
  const s: PodSummary = { cases: 0, identical: 0, differ: 0, differences: [], categories: {}, ms: 0 };
  for (let i = 0; i < cases.length; i++) {
    const r = await diffPod(i, cases[i] as PodCase, decider, netns);
    s.cases++;
    if (r.identical) {
      s.identical++;
      s.categories[r.istio.category] = (s.categories[r.istio.category] ?? 0) + 1;
    } else {
      s.differ++;
      s.differences.push(r);
    }
  }
  s.ms = Date.now() - start;
  return s;
}

export function describePod(c: PodCase): string {
  const p = c.pod;
  const names = (l?: Array<{ name: string }>) => (l ?? []).map((x) => x.name).join(',');
  return `ns=${c.namespace} exclude=[${c.excludeNamespaces}] ips=${c.podIPs.join(',')} containers=${names(p.spec?.containers)} init=${names(p.spec?.initContainers)} labels=${JSON.stringify(p.metadata?.labels)} annotations=${JSON.stringify(p.metadata?.annotations)} proxy=${JSON.stringify([...(p.spec?.containers ?? []), ...(p.spec?.initContainers ?? [])].find((x) => x.name === 'istio-proxy') ?? null)}`;
}
