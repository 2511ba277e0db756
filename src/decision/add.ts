// CNI ADD's decision for one pod, as a pure function: skip it (and why), or
// capture it with which profile, which capture config, which pod addresses and
// which datapath mode. No I/O: everything the agent writes follows from this.
import type { V1Pod } from '@kubernetes/client-node';
import { ebpfLimits } from './ebpf-limits.js';
import { decideMeshed } from './meshed.js';
import type { Mode } from '../loader/mode.js';
import { isObject, type MeshProfile } from '../mesh/vocabulary.js';
import { parseAddr } from '../redirect/cidr.js';
import type { CaptureConfig } from '../redirect/config.js';
import { podToCaptureConfig } from '../redirect/pod.js';

export type AddDecision =
  | { kind: 'skip'; reason: string }
  | {
      kind: 'capture';
      profile: MeshProfile;
      mode: Mode;
      /** Set when the node runs eBPF mode but this pod needs iptables mode. */
      fallbackReason?: string;
      config: CaptureConfig;
      podIPs: string[];
    };

export interface DecideInput {
  /** The node's mode (from the probe). */
  nodeMode: Mode;
  /** The chain's prevResult (the main plugin's addresses), if any. */
  prevResult?: Record<string, unknown>;
}

/**
 * Decides what ADD does for `pod`, whose namespace has passed
 * namespaceExclusion (meshed.ts): the agent asks that first, before it waits
 * for the pod object, as istio-cni does. Throws CaptureConfigError for an invalid
 * annotation and Error for an unusable pod address: the caller names the pod.
 */
export function decideAdd(pod: V1Pod, input: DecideInput): AddDecision {
  const meshed = decideMeshed(pod);
  if (!meshed.meshed) return { kind: 'skip', reason: meshed.reason };
  const podIPs = podIPsOf(input.prevResult, pod);
  // The addresses the main plugin just gave the pod are the truth on this node
  // (status.podIPs is usually still empty when ADD runs); Istio's rule on
  // them decides IPv6 capture, in both modes.
  const config = podToCaptureConfig(pod, meshed.profile, { podIPs });
  if (input.nodeMode === 'iptables') return { kind: 'capture', profile: meshed.profile, mode: 'iptables', config, podIPs };
  const unsupported = ebpfLimits(pod, config, podIPs);
  if (unsupported) return { kind: 'capture', profile: meshed.profile, mode: 'iptables', fallbackReason: unsupported, config, podIPs };
  return { kind: 'capture', profile: meshed.profile, mode: 'ebpf', config, podIPs };
}

/**
 * The pod's addresses: prevResult's ips on the container's interfaces (those
 * with a sandbox), else all its ips; without any, the pod's status.podIPs.
 * Prefix lengths are dropped; duplicates and non-addresses are skipped.
 */
export function podIPsOf(prevResult: Record<string, unknown> | undefined, pod?: V1Pod): string[] {
  const fromResult: string[] = [];
  const ips = prevResult && Array.isArray(prevResult.ips) ? prevResult.ips.filter(isObject) : [];
  const ifaces = prevResult && Array.isArray(prevResult.interfaces) ? prevResult.interfaces : [];
  const inSandbox = (i: unknown) => typeof i === 'number' && isObject(ifaces[i]) && typeof ifaces[i].sandbox === 'string' && ifaces[i].sandbox !== '';
  const sandboxIps = ips.filter((ip) => inSandbox(ip.interface));
  for (const ip of sandboxIps.length > 0 ? sandboxIps : ips) {
    if (typeof ip.address === 'string') fromResult.push(ip.address.split('/')[0]!);
  }
  const candidates = fromResult.length > 0 ? fromResult : (pod?.status?.podIPs ?? []).map((p) => p.ip ?? '');
  const out: string[] = [];
  // A flat copy of each: split()'s piece of a 13+ character "ip/len" is a
  // slice that keeps the whole text alive as long as the record.
  for (const c of candidates) if (parseAddr(c) && !out.includes(c)) out.push(Buffer.from(c).toString());
  // An exact-size copy: the pod's record keeps this array for the pod's
  // life, and one grown by push holds 17 slots (10,000 pods: 1.3 MiB more
  // than the same records read back from disk, in a heap snapshot).
  return out.slice();
}
