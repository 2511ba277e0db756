// A pod in eBPF mode: its map entries plus, when it captures inbound, its own
// sk_lookup link. register() is idempotent (a retried CNI ADD), unregister()
// works when the netns is already gone, check() says what is missing.
import { execa } from 'execa';
import * as bpf from '../native/addon.js';
import type { CaptureConfig } from '../redirect/config.js';
import { attachPodInbound, detachPodInbound, hasPodInbound } from '../loader/pod-inbound.js';
import { configLimit, UnsupportedInEbpfError } from '../decision/ebpf-limits.js';
import { PodMaps, type KeySnapshot } from './registry.js';
import type { McStats } from './layout.js';

export interface RegisteredPod {
  netns: bigint;
  entries: number;
  inboundLink: number | null;
}

/**
 * The proxy's inbound passthrough binds ::6 for IPv6 (127.0.0.6 for IPv4 is on
 * lo already); Istio adds ::6/128 to the pod's lo, and so does meshcap.
 */
async function ensurePassthroughV6(netnsPath: string): Promise<void> {
  const r = await execa('nsenter', [`--net=${netnsPath}`, 'ip', '-6', 'addr', 'replace', '::6/128', 'dev', 'lo'], { reject: false });
  if (r.exitCode !== 0) throw new Error(`cannot add ::6/128 to lo in ${netnsPath} (IPv6 inbound passthrough): ${r.stderr.trim()}`);
}

/** podEntries encodes only: a config eBPF mode cannot honour never reaches the maps. */
function assertSupported(cfg: CaptureConfig, podIPs: string[]): void {
  const limit = configLimit(cfg, podIPs);
  if (limit) throw new UnsupportedInEbpfError(limit);
}

export class EbpfPods {
  private readonly maps: PodMaps;

  constructor(readonly pinRoot: string) {
    this.maps = new PodMaps(pinRoot);
  }

  close(): void {
    this.maps.close();
  }

  /** The pod identity both the agent and the kernel programs compute. */
  static netnsCookie(netnsPath: string): Promise<bigint> {
    return bpf.netnsCookie(netnsPath);
  }

  async register(netnsPath: string, cfg: CaptureConfig, podIPs: string[]): Promise<RegisteredPod> {
    const netns = await bpf.netnsCookie(netnsPath);
    if (cfg.enableIPv6 || podIPs.some((ip) => ip.includes(':'))) await ensurePassthroughV6(netnsPath);
    assertSupported(cfg, podIPs);
    const e = this.maps.write(netns, cfg, podIPs);
    let inboundLink: number | null = null;
    if (cfg.parsed.inboundCapture) {
      inboundLink = (await attachPodInbound(this.pinRoot, netns, netnsPath)).linkId;
    } else {
      detachPodInbound(this.pinRoot, netns);
    }
    return { netns, entries: 2 + e.cidrs.length + e.ports.length, inboundLink };
  }

  /** Remove everything of the pod; returns the number of map entries removed. */
  unregister(netns: bigint): number {
    detachPodInbound(this.pinRoot, netns);
    return this.maps.remove(netns);
  }

  /** snap: the keys of a whole pass (see KeySnapshot); without it the maps are scanned for this pod. */
  check(netns: bigint, cfg: CaptureConfig, podIPs: string[], snap?: KeySnapshot): string[] {
    assertSupported(cfg, podIPs);
    const problems = this.maps.diff(netns, cfg, podIPs, snap);
    if (cfg.parsed.inboundCapture && !hasPodInbound(this.pinRoot, netns)) problems.push('no inbound sk_lookup link pinned');
    return problems;
  }

  snapshot(): KeySnapshot {
    return this.maps.snapshot();
  }

  refreshSnapshot(snap: KeySnapshot, netns: bigint): void {
    this.maps.refreshSnapshot(snap, netns);
  }

  /** False once the pinned maps are no longer the ones this object holds (reload needed). */
  matchesPins(): boolean {
    return this.maps.matchesPins();
  }

  pods(): bigint[] {
    return this.maps.pods();
  }

  stats(netns: bigint): McStats | null {
    return this.maps.stats(netns);
  }

  /** Entries left for a netns in any per-pod map (0 after unregister). */
  leftovers(netns: bigint): number {
    return (this.maps.pod(netns) ? 1 : 0) + (this.maps.stats(netns) ? 1 : 0) +
      this.maps.keysOf('mc_cidrs', netns).length + this.maps.keysOf('mc_ports', netns).length +
      (hasPodInbound(this.pinRoot, netns) ? 1 : 0);
  }
}
