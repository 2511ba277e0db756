// The eBPF backend: a pod is its entries in the pinned maps (mc_pods last, see
// src/maps/registry.ts) plus, when it captures inbound, its own sk_lookup link
// (ebpf-inbound.ts); a running proxy's inbound listener can be put back into
// mc_listen (ebpf-listeners.ts). Keyed by the netns cookie, so unregister
// works when the netns is already gone. The extras below the PodBackend
// methods (snapshot, stats, pods, remove, refillListeners, ...) are what only
// eBPF mode has: the reconciler, `meshcap status`, metrics and tests use them.
import path from 'node:path';
import { configLimit, UnsupportedInEbpfError } from '../decision/ebpf-limits.js';
import { pinLayout } from '../loader/manifest.js';
import * as bpf from '../native/addon.js';
import { MAP, type McStats } from '../maps/layout.js';
import { PodMaps, type KeySnapshot } from '../maps/registry.js';
import type { CaptureConfig } from '../redirect/config.js';
import { addPassthroughV6, ephemeralPorts, netnsCookie, netnsProblem, removeReplyRoutes, v6SpillAt } from '../pod-netns.js';
import type { PodBackend, PodSetup, RemoveOutcome } from './backend.js';
import { attachPodInbound, detachPodInbound, hasPodInbound, linkProvesNetns, linksProveNetns, linksProveNetnsAsync } from './ebpf-inbound.js';
import { InboundPool } from './inbound-pool.js';
import type { ListenerIndex } from './listener-index.js';
import { listenerFill, listenerSnapshot, refillPodListeners, type ListenerRefill, type NetnsProcesses } from './ebpf-listeners.js';

/** podEntries encodes only: a config eBPF mode cannot honour never reaches the maps. */
function assertSupported(cfg: CaptureConfig, podIPs: string[]): void {
  const limit = configLimit(cfg, podIPs);
  if (limit) throw new UnsupportedInEbpfError(limit);
}

export interface EbpfBackendOptions {
  /**
   * Inbound programs kept loaded ahead of the pods (inbound-pool.ts): the
   * agent's; 0 or absent (CLI commands, tests) loads one per pod when needed.
   */
  inboundPool?: number;
  onInboundPoolError?: (err: Error) => void;
}

export class EbpfBackend implements PodBackend {
  readonly mode = 'ebpf' as const;
  private readonly maps: PodMaps;
  /** Loaded, unattached inbound programs; undefined without the option. */
  readonly inboundPool: InboundPool | undefined;
  /**
   * Pods removed whose destination slots (mc_dstslot) are still there, with
   * their netns path where known: a slot names the original destination of
   * the pod's connections for as long as they live, as conntrack answers
   * for a connection after the rules are gone, so it goes with the netns,
   * not with the pod's entry (sweepSlots).
   */
  private readonly removedSlots = new Map<bigint, string | null>();

  /** Opens the pinned maps under pinRoot; throws, naming `meshcap load`, when the datapath is not loaded. */
  constructor(readonly pinRoot: string, opts: EbpfBackendOptions = {}) {
    const dir = pinLayout(pinRoot).maps;
    this.maps = new PodMaps(dir);
    if (opts.inboundPool && opts.inboundPool > 0) {
      const fd = bpf.objGet(path.join(dir, MAP.pods));
      let podsMapId: number;
      try {
        podsMapId = bpf.mapInfo(fd).id;
      } finally {
        bpf.closeFd(fd);
      }
      this.inboundPool = new InboundPool({ mapsDir: dir, size: opts.inboundPool, podsMapId, ...(opts.onInboundPoolError ? { onError: opts.onInboundPoolError } : {}) });
    }
  }

  /** Closes the maps and frees the pool's waiting programs (pods' pinned links stay). */
  close(): void {
    this.inboundPool?.close();
    this.maps.close();
  }

  async register(p: PodSetup): Promise<bigint> {
    const netns = p.netnsCookie ?? (await netnsCookie(p.netns));
    const hasV6 = p.podIPs.some((ip) => ip.includes(':'));
    // IPv6 slots where its IPv6 connections are captured and the datapath has them
    const v6Slots = p.config.enableIPv6 && hasV6 && this.maps.hasV6Slots();
    if (p.config.enableIPv6 || hasV6) await addPassthroughV6(p.netns, { slotRoute: v6Slots });
    assertSupported(p.config, p.podIPs);
    // before the pod's entries, so a full map refuses the pod with nothing of it
    // written; a pod registered again keeps its entry (and the kernel's count),
    // so its port range is read only the first time
    const spill = v6Slots && !this.maps.v6Spill(netns) ? this.maps.writeV6Spill(netns, v6SpillAt(await ephemeralPorts(p.netns))) : null;
    try {
      this.maps.write(netns, p.config, p.podIPs);
    } catch (e) {
      if (spill === 'created') this.maps.removeV6Spill(netns);
      throw e;
    }
    if (p.config.parsed.inboundCapture) {
      await attachPodInbound(this.pinRoot, netns, p.netns, this.inboundPool);
    } else {
      detachPodInbound(this.pinRoot, netns);
    }
    return netns;
  }

  async unregister(p: PodSetup, cookie: bigint | null): Promise<RemoveOutcome> {
    // Keyed by cookie: works without the netns (the sk_lookup link is defunct then).
    if (cookie === null) throw new Error('eBPF record without a netns cookie');
    this.remove(cookie, p.netns);
    // the replies' route the builds from 0b6b34f to eed882e added at ADD (pod-netns.ts)
    removeReplyRoutes(p.netns, p.podIPs);
    return 'removed';
  }

  async check(p: PodSetup, cookie: bigint | null, snap?: KeySnapshot): Promise<string[]> {
    const gone = await netnsProblem(p.netns, cookie);
    if (gone) return [gone];
    if (cookie === null) return ['eBPF record without a netns cookie'];
    return this.checkEntries(cookie, p.config, p.podIPs, snap);
  }

  // ---- eBPF only

  /** The pod's map entries and inbound link against its config (no netns needed). */
  checkEntries(netns: bigint, cfg: CaptureConfig, podIPs: string[], snap?: KeySnapshot): string[] {
    const problems = this.checkMapEntries(netns, cfg, podIPs, snap);
    const link = this.checkInboundLink(netns, cfg, snap);
    if (link) problems.push(link);
    return problems;
  }

  /** checkEntries' map part: what differs in the pod's map entries (empty: none). */
  checkMapEntries(netns: bigint, cfg: CaptureConfig, podIPs: string[], snap?: KeySnapshot): string[] {
    assertSupported(cfg, podIPs);
    return this.maps.diff(netns, cfg, podIPs, snap);
  }

  /** checkEntries' link part: a pod that captures inbound has its sk_lookup link pinned (a snapshot's seen links need no look). */
  checkInboundLink(netns: bigint, cfg: CaptureConfig, snap?: KeySnapshot): string | undefined {
    if (cfg.parsed.inboundCapture && !snap?.inboundSeen.has(netns) && !hasPodInbound(this.pinRoot, netns)) return 'no inbound sk_lookup link pinned';
    return undefined;
  }

  /**
   * The recorded netns path still names the pod's netns, shown by its pinned
   * link (false: unknown, look it up). A pass's snapshot notes the link as seen
   * (checkEntries then needs no second look for it).
   */
  netnsShownLive(netnsPath: string, netns: bigint, snap?: KeySnapshot): boolean {
    const shown = linkProvesNetns(this.pinRoot, netns, netnsPath);
    if (shown) snap?.inboundSeen.add(netns);
    return shown;
  }

  /** netnsShownLive for many pods at once (one native call: `meshcap status`, the reconcile). */
  netnsShownLiveMany(pods: { netnsPath: string; netns: bigint }[], snap?: KeySnapshot): boolean[] {
    const shown = linksProveNetns(this.pinRoot, pods);
    if (snap) pods.forEach((p, i) => shown[i] && snap.inboundSeen.add(p.netns));
    return shown;
  }

  /**
   * netnsShownLiveMany with the syscalls on a worker thread (`meshcap status`
   * compares the pods' entries meanwhile). Notes no link in a snapshot: the
   * caller checks the links of the pods it shows (linkCheck).
   */
  netnsShownLiveManyAsync(pods: { netnsPath: string; netns: bigint }[]): Promise<boolean[]> {
    return linksProveNetnsAsync(this.pinRoot, pods);
  }

  /**
   * Removes everything of the pod by its cookie but its destination slots,
   * which sweepSlots removes once its netns (at netnsPath) is gone; returns
   * the number of map entries removed.
   */
  remove(netns: bigint, netnsPath?: string): number {
    detachPodInbound(this.pinRoot, netns);
    this.removedSlots.set(netns, netnsPath ?? null);
    return this.maps.remove(netns);
  }

  /**
   * Removes the destination slots of removed pods whose netns is gone (no
   * socket of it is left to ask) or, with `all` (the agent's start, before
   * it serves), of every netns that is not a pod in mc_pods and not known
   * to be alive; a removed pod that is a pod again keeps its slots. Returns
   * how many slots went.
   */
  async sweepSlots(opts: { all?: boolean } = {}): Promise<number> {
    // A self-check pass with no pod removed since the last costs nothing
    // (at 10,000 pods a read of mc_pods would cost every pass).
    if (!opts.all && this.removedSlots.size === 0) return 0;
    const es = this.maps.slotEntries();
    const withSlots = new Set<bigint>();
    for (const { e } of es) for (let i = 0; i < e.count; i++) withSlots.add(e.keys.readBigUInt64LE(i * e.keySize));
    const gone = new Set<bigint>();
    const alive = new Set<bigint>();
    for (const [cookie, netnsPath] of this.removedSlots) {
      // no slots (it made no connection, or they went): nothing to wait for;
      // a pod again keeps its own
      if (!withSlots.has(cookie) || this.maps.pod(cookie)) this.removedSlots.delete(cookie);
      else if (netnsPath === null || (await netnsProblem(netnsPath, cookie)) !== undefined) gone.add(cookie);
      else alive.add(cookie);
    }
    const live = opts.all ? this.maps.podsByCookie() : undefined;
    const n = this.maps.removeSlots((cookie) => gone.has(cookie) || (live !== undefined && !live.has(cookie) && !alive.has(cookie)), es);
    // mc_v6spill goes with the pod (remove); at the start, what an agent that
    // did not know the map (an earlier build) left of removed pods
    if (live) this.maps.removeV6SpillOf((cookie) => !live.has(cookie));
    for (const cookie of gone) this.removedSlots.delete(cookie);
    return n;
  }

  /** The pod's destination slots (slot -> mc_slot value; IPv6: mc_slot6), for tests. */
  slotsOf(netns: bigint, family: 4 | 6 = 4): Map<number, Buffer> {
    return this.maps.slotsOf(netns, family === 4 ? MAP.dstslot : MAP.dstslot6);
  }

  /** The pod's mc_v6spill entry (null: its IPv6 connections all go to ::1). */
  v6Spill(netns: bigint): { open: bigint; at: bigint } | null {
    return this.maps.v6Spill(netns);
  }

  /** The CIDR/port keys of every pod, one scan per map: for a pass over all pods (see KeySnapshot). */
  snapshot(): KeySnapshot {
    return this.maps.snapshot();
  }

  refreshSnapshot(snap: KeySnapshot, netns: bigint, what?: 'written' | 'values'): void {
    this.maps.refreshSnapshot(snap, netns, what);
  }

  /** False once the pinned maps are no longer the ones this object holds (reload needed). */
  matchesPins(): boolean {
    return this.maps.matchesPins();
  }

  /** Cookies of the pods in mc_pods. */
  pods(): bigint[] {
    return this.maps.pods();
  }

  stats(netns: bigint): McStats | null {
    return this.maps.stats(netns);
  }

  /** Puts a running proxy's inbound listener back into mc_listen where it is missing (after a map reload). */
  refillListeners(o: { netns: bigint; netnsPath: string; port: number; processes: () => NetnsProcesses; listening?: ListenerIndex }): ListenerRefill {
    return refillPodListeners({ pinRoot: this.pinRoot, ...o });
  }

  /** The pods' listeners in mc_listen, one map walk: for a pass over every pod (refillListeners' `listening`). */
  listenerSnapshot(): ListenerIndex {
    return listenerSnapshot(this.pinRoot);
  }

  /**
   * How full the per-pod maps are (entries counted by one key walk each, at
   * most their max_entries): the capacity limits an operator runs into first
   * (16,384 pods, 65,536 CIDR or port entries per node). The per-connection
   * LRU maps are not counted: they evict by design, and walking 262,144 keys
   * per scrape would cost more than it tells.
   */
  fill(): { map: string; entries: number; maxEntries: number }[] {
    const listen = listenerFill(this.pinRoot);
    return listen ? [...this.maps.fill(), listen] : this.maps.fill();
  }

  /** Entries left for a netns in any per-pod map (0 after remove; its destination slots are not counted: they go with the netns, sweepSlots). */
  leftovers(netns: bigint): number {
    return (this.maps.pod(netns) ? 1 : 0) + (this.maps.stats(netns) ? 1 : 0) +
      this.maps.keysOf('mc_cidrs', netns).length + this.maps.keysOf('mc_ports', netns).length + this.maps.keysOf('mc_portranges', netns).length +
      (hasPodInbound(this.pinRoot, netns) ? 1 : 0);
  }
}
