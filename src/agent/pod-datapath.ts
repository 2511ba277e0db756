// Writes, removes and verifies one pod's redirect in its mode: eBPF map
// entries (EbpfPods) or istio-iptables rules in the pod netns. Knows nothing
// about CNI or pod objects: it gets a netns, a capture config and addresses.
import { existsSync } from 'node:fs';
import type { Logger } from 'pino';
import { applyCapture, checkCapture, removeCapture, type IptablesOptions } from '../fallback-iptables/apply.js';
import type { Mode } from '../loader/mode.js';
import { EbpfPods } from '../maps/ebpf-pods.js';
import type { KeySnapshot } from '../maps/registry.js';
import type { CaptureConfig } from '../redirect/config.js';

export interface PodTarget {
  mode: Mode;
  netns: string;
  config: CaptureConfig;
  podIPs: string[];
}

export type RemoveOutcome = 'removed' | 'netns-gone' | 'netns-replaced';
/** Whether a record's netns path still names the netns it was made for. */
export type NetnsState = 'live' | 'gone' | 'replaced';

export class PodDatapath {
  private readonly iptables: IptablesOptions;

  /**
   * ebpf: the node's pinned maps, or null when the node runs iptables mode.
   * Replaced (not mutated) when the self-check reloads a lost datapath.
   */
  constructor(public ebpf: EbpfPods | null, logger: Logger) {
    // apply/remove log one info line each; the CNI request line already says it.
    // (never louder than the parent: `meshcap status` passes a silent one)
    this.iptables = { logger: logger.child({ component: 'iptables' }, { level: logger.levelVal > 40 ? logger.level : 'warn' }) };
  }

  private ebpfPods(): EbpfPods {
    if (!this.ebpf) throw new Error('the eBPF datapath is not loaded on this node (the agent runs in iptables mode)');
    return this.ebpf;
  }

  /** Sets the pod up (idempotent). Returns its netns cookie (null if the kernel cannot tell it). */
  async register(t: PodTarget): Promise<bigint | null> {
    if (t.mode === 'ebpf') return (await this.ebpfPods().register(t.netns, t.config, t.podIPs)).netns;
    // The cookie tells a later DEL whether the path still names the same netns.
    const cookie = await EbpfPods.netnsCookie(t.netns).catch(() => null);
    await applyCapture(t.netns, t.config, this.iptables);
    return cookie;
  }

  /** Removes the pod's redirect; fine when the netns is already gone. */
  async unregister(t: PodTarget, cookie: bigint | null): Promise<RemoveOutcome> {
    if (t.mode === 'ebpf') {
      // Keyed by cookie: works without the netns (the sk_lookup link is defunct then).
      if (cookie === null) throw new Error('eBPF record without a netns cookie');
      this.ebpfPods().unregister(cookie);
      return 'removed';
    }
    const live = await this.liveCookie(t.netns);
    if (live === 'gone') return 'netns-gone';
    if (cookie !== null && live !== null && live !== cookie) return 'netns-replaced';
    await removeCapture(t.netns, t.config, this.iptables);
    return 'removed';
  }

  /** What is missing or different in the live datapath (empty: all present). */
  async check(t: PodTarget, cookie: bigint | null, snap?: KeySnapshot): Promise<string[]> {
    const live = await this.liveCookie(t.netns);
    if (live === 'gone') return [`network namespace ${t.netns} does not exist`];
    if (cookie !== null && live !== null && live !== cookie) return [`${t.netns} is now a different network namespace (cookie ${live}, recorded ${cookie})`];
    if (t.mode === 'ebpf') {
      if (cookie === null) return ['eBPF record without a netns cookie'];
      return this.ebpfPods().check(cookie, t.config, t.podIPs, snap);
    }
    return (await checkCapture(t.netns, t.config, this.iptables)).differences;
  }

  async netnsState(netns: string, cookie: bigint | null): Promise<NetnsState> {
    const live = await this.liveCookie(netns);
    if (live === 'gone') return 'gone';
    return cookie !== null && live !== null && live !== cookie ? 'replaced' : 'live';
  }

  private async liveCookie(netns: string): Promise<bigint | null | 'gone'> {
    if (netns === '' || !existsSync(netns)) return 'gone';
    try {
      return await EbpfPods.netnsCookie(netns);
    } catch (err) {
      // A leftover file that is no longer a netns mount.
      if (/ENOENT|EINVAL|not a network namespace/i.test((err as Error).message)) return 'gone';
      return null;
    }
  }
}
