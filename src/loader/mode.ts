// The mode decision as a pure function of the probe's inputs, so every row of
// the table is testable without booting a kernel.
import { MIN_EBPF_KERNEL, REQUIRED_FEATURES, type FeatureResult } from './features.js';
import { kernelAtLeast, parseKernelRelease } from './kernel.js';

export type Mode = 'ebpf' | 'iptables';
export type ModeRequest = Mode | 'auto';

export interface ModeDecision {
  mode: Mode;
  reasons: string[];
}

export class ModeRefusedError extends Error {
  constructor(readonly reasons: string[]) {
    super(`eBPF mode refused on this node: ${reasons.join('; ')}. Run 'meshcap probe' for details, or use --mode auto/iptables.`);
    this.name = 'ModeRefusedError';
  }
}

export function decideMode(input: {
  kernel: string;
  features: Record<string, FeatureResult>;
  requested: ModeRequest;
}): ModeDecision {
  const { kernel, features, requested } = input;
  if (requested === 'iptables') return { mode: 'iptables', reasons: ['iptables mode forced by --mode iptables'] };

  const blockers: string[] = [];
  const v = parseKernelRelease(kernel);
  if (!kernelAtLeast(v, MIN_EBPF_KERNEL.major, MIN_EBPF_KERNEL.minor)) {
    blockers.push(`kernel ${kernel} is below ${MIN_EBPF_KERNEL.major}.${MIN_EBPF_KERNEL.minor}: iptables mode always`);
  }
  for (const spec of REQUIRED_FEATURES) {
    const r = features[spec.name];
    if (!r) blockers.push(`${spec.name} was not probed`);
    else if (!r.ok && r.denied) blockers.push(`${spec.name} not permitted to the agent (for ${spec.why}): ${r.detail ?? 'EPERM'}: give the agent's container the DaemonSet's capabilities (NET_ADMIN, SYS_ADMIN)`);
    else if (!r.ok) blockers.push(`${spec.name} missing (needs Linux ${spec.since}+, for ${spec.why})${r.detail ? `: ${r.detail}` : ''}`);
  }
  if (blockers.length === 0) {
    return { mode: 'ebpf', reasons: [`every hook eBPF mode needs is present (kernel ${kernel})${requested === 'ebpf' ? ', --mode ebpf' : ''}`] };
  }
  if (requested === 'ebpf') throw new ModeRefusedError(blockers);
  return { mode: 'iptables', reasons: blockers };
}

/**
 * Mode is sticky: where an earlier agent pinned the eBPF datapath (pins live
 * until reboot or uninstall, so on this boot's kernel, which accepted it),
 * eBPF mode stays without probing: a transient probe failure must not flip a
 * node with running eBPF pods to iptables (its pods' DELs and CHECKs would
 * then look in the wrong datapath), and the probe's trial loads are most of
 * a restart's time. If eBPF really is gone, loading the datapath fails
 * loudly instead. --mode iptables still wins. null: no pins, probe.
 */
export function pinnedMode(requested: ModeRequest, pinned: boolean, pinRoot: string): ModeDecision | null {
  if (requested === 'iptables' || !pinned) return null;
  return { mode: 'ebpf', reasons: [`the eBPF datapath is pinned under ${pinRoot} (loaded on this boot's kernel): staying in eBPF mode, no probe`] };
}
