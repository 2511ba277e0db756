// What eBPF mode cannot honour for a pod, as one pure function over its
// capture config and addresses: no map bytes are built to find out. The ADD
// decision (add.ts) gives such a pod iptables mode with the reason; the eBPF
// backend (src/pod-datapath/ebpf.ts) refuses to write one, so a pod recorded
// in eBPF mode by an older agent is reported, never half-captured.
import type { V1Pod } from '@kubernetes/client-node';
import { MC_POD_ADDRS } from '../maps/layout.js';
import { ISTIO_ANNOTATIONS } from '../mesh/vocabulary.js';
import { cidrToString, parseAddr } from '../redirect/cidr.js';
import type { CaptureConfig } from '../redirect/config.js';

/** One setting eBPF mode cannot honour, and the value that makes it so. */
export interface EbpfLimit {
  setting: string;
  detail: string;
}

/** A setting the eBPF datapath cannot honour: the pod must not be silently half-captured. */
export class UnsupportedInEbpfError extends Error {
  readonly setting: string;
  constructor(limit: EbpfLimit) {
    super(limitMessage(limit));
    this.setting = limit.setting;
    this.name = 'UnsupportedInEbpfError';
  }
}

export function limitMessage(l: EbpfLimit): string {
  return `${l.setting}: ${l.detail} is not supported in eBPF mode (use iptables mode for this pod or node)`;
}

/** The first setting of this config eBPF mode cannot honour, or undefined. */
export function configLimit(cfg: CaptureConfig, podIPs: readonly string[]): EbpfLimit | undefined {
  const p = cfg.parsed;
  // mc_pod holds one uid and one gid.
  if (p.proxyUids.length > 1) return { setting: 'proxy uid', detail: `more than one uid (${p.proxyUids.join(',')})` };
  if (p.proxyGids.length > 1) return { setting: 'proxy gid', detail: `more than one gid (${p.proxyGids.join(',')})` };
  if (!(p.ownerGroups.except && p.ownerGroups.values.length === 0)) {
    return { setting: 'ISTIO_OUTBOUND_OWNER_GROUPS(_EXCLUDE)', detail: 'an owner-group filter' };
  }
  if (p.excludeInterfaces.length || p.kubeVirtInterfaces.length) {
    return { setting: `${ISTIO_ANNOTATIONS.excludeInterfaces} / kubevirtInterfaces`, detail: 'per-interface rules' };
  }
  // Envoy's TPROXY inbound reaches the app from the client's address with
  // mark 1337, which Istio's mangle/mark rules let through; the connect hook
  // sees only the proxy uid and a connect to the pod's own address, and would
  // send it back to 15006.
  if (p.tproxy) return { setting: 'interception mode', detail: 'TPROXY (original-source upstream with socket mark)' };
  // Istio drops its `-o lo` RETURN when an include range covers loopback; the
  // programs always leave loopback alone.
  if (p.outboundIncludesLoopback) return { setting: 'includeOutboundIPRanges', detail: 'a range covering loopback' };
  // The programs hard-code Istio's default 127.0.0.1/32.
  const lo = p.hostIPv4Loopback;
  if (lo.prefix !== 32 || lo.address !== '127.0.0.1') {
    return { setting: 'ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR', detail: `${cidrToString(p.hostIPv4Loopback)} (only 127.0.0.1/32)` };
  }
  // mc_pod has MC_POD_ADDRS slots per family (no family can have more when
  // the pod has no more addresses in all: no parse then, as for every pod
  // of a `meshcap status` or self-check pass).
  if (podIPs.length > MC_POD_ADDRS) {
    const families = podIPs.map((ip) => parseAddr(ip)?.family);
    if (families.filter((f) => f === 4).length > MC_POD_ADDRS || families.filter((f) => f === 6).length > MC_POD_ADDRS) {
      return { setting: 'pod addresses', detail: `more than ${MC_POD_ADDRS} addresses per family` };
    }
  }
  return undefined;
}

/**
 * A pod with its own user namespace (`hostUsers: false`): the programs see
 * host uids (bpf_get_current_uid_gid), so the proxy's uid 1337 inside the pod
 * is not 1337 to them and its own connections would loop back to 15001. The
 * iptables owner match translates through the netns's user namespace, as
 * istio-cni relies on.
 */
export function userNamespaced(pod: V1Pod): string | undefined {
  if (pod.spec?.hostUsers !== false) return undefined;
  return 'hostUsers: false (a user-namespaced pod): the eBPF programs see host uids, not the proxy\'s uid inside the pod, so it uses iptables mode';
}

/** Why eBPF mode cannot capture this pod (it then gets iptables mode), or undefined. */
export function ebpfLimits(pod: V1Pod, cfg: CaptureConfig, podIPs: readonly string[]): string | undefined {
  const userns = userNamespaced(pod);
  if (userns) return userns;
  const limit = configLimit(cfg, podIPs);
  return limit ? limitMessage(limit) : undefined;
}
