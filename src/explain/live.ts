// `meshcap explain NAMESPACE/NAME`: one connection of a pod this node's agent
// captures, explained from what was applied (the agent's record) and checked
// against what the kernel holds: in eBPF mode the pod's pinned map entries,
// decided the way the programs decide (kernel-verdict.ts); in iptables mode
// the rules live in the pod's netns, walked like the rendered ones.
import { configOf, cookieOf, readRecords, type AttachmentRecord } from '../agent/state-store.js';
import { liveRules } from '../fallback-iptables/apply.js';
import { netnsState } from '../pod-netns.js';
import { explainFlow, explainFlowInRules, type Explanation, type Flow } from './explain.js';
import { kernelVerdict, PinnedPodMaps, type KernelVerdict } from './kernel-verdict.js';

export interface LiveExplanation {
  pod: { namespace: string; name: string; containerId: string; mode: 'ebpf' | 'iptables'; profile: string; netns: string; netnsCookie: string | null; podIPs: string[] };
  flow: Flow;
  /** The verdict of the pod's rules as rendered from its record (Istio semantics). */
  rules: Explanation;
  /** What the kernel does: eBPF maps + program logic, or the live iptables rules. */
  kernel: { source: string; verdict: 'captured' | 'not captured' | 'refused' | 'dropped'; to?: string; decidedBy: string };
  /** The kernel does what the rules say. */
  agree: boolean;
  notes: string[];
}

export class NoRecordError extends Error {}

export function findRecord(records: AttachmentRecord[], namespace: string, name: string): AttachmentRecord[] {
  return records.filter((r) => r.podNamespace === namespace && r.podName === name);
}

function sameOutcome(rules: Explanation, k: LiveExplanation['kernel'], rec: AttachmentRecord): boolean {
  if (rules.verdict === 'not captured') return k.verdict === 'not captured';
  if (rules.verdict === 'dropped') return k.verdict === 'dropped' || k.verdict === 'refused';
  if (k.verdict === 'refused') return rec.mode === 'ebpf'; // captured, proxy not listening: a REDIRECT to a closed port is refused too
  if (k.verdict !== 'captured') return false;
  return rules.toPort === undefined || (k.to ?? '').endsWith(`${rules.toPort}`);
}

export async function explainLive(o: { stateDir: string; pinRoot: string; namespace: string; name: string; flow: Omit<Flow, 'podIPs'> }): Promise<LiveExplanation> {
  const { records, problems } = readRecords(o.stateDir);
  const mine = findRecord(records, o.namespace, o.name);
  if (mine.length === 0) {
    throw new NoRecordError(`pod ${o.namespace}/${o.name} has no record in ${o.stateDir}: this node's agent does not capture it ` +
      `(not meshed, in an excluded namespace, on another node, or its CNI ADD failed: see meshcap status and the agent's log)` +
      (problems.length ? `; unreadable records: ${problems.join('; ')}` : ''));
  }
  // Several attachments (interfaces) of one pod share its netns and config.
  const rec = mine[0]!;
  const flow: Flow = { ...o.flow, podIPs: rec.podIPs };
  const config = configOf(rec);
  const rules = explainFlow(config, flow);
  const cookie = cookieOf(rec);
  const notes: string[] = [];
  if (mine.length > 1) notes.push(`${mine.length} attachments (${mine.map((r) => r.ifname).join(', ')}) share this pod's netns; explained for ${rec.ifname}`);
  const netns = await netnsState(rec.netns, cookie);
  let kernel: LiveExplanation['kernel'];
  if (netns !== 'live') {
    kernel = { source: 'none', verdict: 'not captured', decidedBy: netns === 'replaced' ? `${rec.netns} is now a different network namespace: the recorded pod is gone` : `the pod's netns ${rec.netns} is gone` };
  } else if (rec.mode === 'ebpf') {
    if (cookie === null) throw new Error(`pod ${o.namespace}/${o.name}: eBPF record without a netns cookie (${o.stateDir})`);
    const maps = new PinnedPodMaps(o.pinRoot);
    let k: KernelVerdict;
    try {
      k = kernelVerdict(maps, cookie, flow);
    } finally {
      maps.close();
    }
    kernel = { source: `eBPF maps under ${o.pinRoot} (netns cookie ${cookie})`, ...k };
  } else {
    const family = flow.peer.includes(':') ? 6 : 4;
    const text = await liveRules(rec.netns, family);
    const live = explainFlowInRules(text, config.parsed.tproxy, flow);
    kernel = {
      source: `the ip${family === 6 ? '6' : ''}tables rules live in ${rec.netns}`,
      verdict: live.verdict,
      ...(live.toPort !== undefined ? { to: `port ${live.toPort}` } : {}),
      decidedBy: live.rule ?? `no rule matches (${live.path.join(' -> ')})`,
    };
  }
  return {
    pod: { namespace: rec.podNamespace, name: rec.podName, containerId: rec.containerId, mode: rec.mode, profile: rec.profile, netns: rec.netns, netnsCookie: rec.netnsCookie, podIPs: rec.podIPs },
    flow, rules, kernel, agree: sameOutcome(rules, kernel, rec), notes,
  };
}

export function formatLive(r: LiveExplanation): string {
  const k = r.kernel;
  return [
    `pod ${r.pod.namespace}/${r.pod.name} (${r.pod.mode} mode, ${r.pod.profile}, netns ${r.pod.netns}${r.pod.netnsCookie ? `, cookie ${r.pod.netnsCookie}` : ''})`,
    `rules (from the agent's record, Istio semantics): ${r.rules.reason}`,
    `kernel (${k.source}): ${k.verdict.toUpperCase()}${k.to ? ` -> ${k.to}` : ''}: ${k.decidedBy}`,
    ...r.notes.map((n) => `note: ${n}`),
    r.agree ? 'the kernel does what the rules say' :
      'THE KERNEL DISAGREES with the pod\'s rules: its datapath differs from its record (see `meshcap status` for the drift; the agent\'s self-check restores it) or this is a bug worth reporting with this output',
  ].join('\n');
}
