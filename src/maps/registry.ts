// Writes and removes pods in the pinned maps. Order matters for a live
// datapath: a pod's CIDR and port entries go in before its mc_pods entry (the
// entry that switches capture on), and on removal mc_pods goes first, so a
// connection never sees a half-configured pod.
import { existsSync } from 'node:fs';
import path from 'node:path';
import * as bpf from '../native/addon.js';
import type { MapEntries } from '../native/addon.js';
import type { CaptureConfig } from '../redirect/config.js';
import { MAP, MAPS_ADDED_LATER, mcPod, mcStats, mcV6Spill, u64Key, type McPod, type McStats, type McV6Spill } from './layout.js';
import { CookieMap, hexKeysByCookie, packedKeysByCookie, valuesByCookie } from './cookie-map.js';
import { FULL, MapFullError } from './map-full.js';
import { keyedEntries, keyTemplates, keyWithNetns, netnsOfKey, NETNS_OFFSET, podEntries, podValue, type KeyTemplate, type MapEntry, type MapName, type PodEntries } from './pod-entries.js';

const SWEPT_ALL: MapName[] = [MAP.cidrs, MAP.ports, MAP.portranges];

/**
 * One pod's keys in one map, packed end to end in a latin1 string (one byte
 * per char). The index held one Buffer per key: at 10,000 pods ~40,000
 * Buffers, each a typed array plus its own ArrayBuffer, 8 MiB of heap for
 * ~1 MiB of keys. A one-byte string is a header and the bytes, immutable,
 * and outside Node's Buffer pool (a pooled slice would keep its 8 KiB pool
 * alive after the other pods sharing it were removed).
 */
type PackedKeys = string;

function packKeys(keys: Buffer[]): PackedKeys {
  return Buffer.concat(keys).toString('latin1');
}

/** The keys of a packed run, each `size` bytes (views of one Buffer). */
function unpackKeys(packed: PackedKeys | undefined, size: number): Buffer[] {
  if (!packed) return [];
  const all = Buffer.from(packed, 'latin1');
  const out: Buffer[] = [];
  for (let at = 0; at + size <= all.length; at += size) out.push(all.subarray(at, at + size));
  return out;
}


/**
 * The per-pod maps as one pass over every pod sees them, read whole (one
 * BPF_MAP_LOOKUP_BATCH per few thousand entries, see bpf.mapEntries): a pass
 * (the agent's reconcile, `meshcap status`) compares each pod against it
 * instead of looking up each pod's entries, or scanning whole maps per pod
 * (O(pods x entries)). diff() without one reads the kernel itself. The
 * entries stay in the read Buffers (CookieMap): no object per pod is held.
 */
export interface KeySnapshot {
  /** The CIDR/port/range keys (hex) of each pod, by map. */
  keys: Map<MapName, CookieMap<Set<string>>>;
  /** mc_pods and mc_stats values by netns cookie. */
  pods: CookieMap<Buffer>;
  stats: CookieMap<Buffer>;
  /** mc_portranges values by key (hex): a range's bounds are in its value. */
  ranges: Map<string, Buffer>;
  /** Pods whose inbound link pin was seen during this pass (EbpfBackend.netnsShownLive). */
  inboundSeen: Set<bigint>;
}

const NO_KEYS: ReadonlySet<string> = new Set();
const SLOT_MAPS = [MAP.dstslot, MAP.dstslot6] as const;
/** Destination slot maps read whole, one entry per map the datapath has. */
export type SlotEntries = { map: (typeof SLOT_MAPS)[number]; e: MapEntries }[];
const NO_TEMPLATES: readonly KeyTemplate[] = [];
const HEX_SCRATCH = Buffer.alloc(8);
/** The cookie as its 8 little-endian key bytes in hex (no Buffer per call). */
const cookieHex = (netns: bigint) => (HEX_SCRATCH.writeBigUInt64LE(netns), HEX_SCRATCH.toString('hex'));

export class PodMaps {
  private readonly fds = new Map<MapName, number>();
  private sweptMaps: readonly MapName[] | undefined;
  private readonly keySizes = new Map<MapName, number>();
  private readonly valueSizes = new Map<MapName, number>();
  /** The CIDR/port keys each pod has in the maps, built by one scan on first
   * use and kept by write/remove: without it every ADD and DEL walked every
   * pod's entries (O(node) per pod). The agent is the maps' only writer;
   * diff() still reads the kernel, so CHECK sees what the index cannot. */
  private index: Map<MapName, Map<bigint, PackedKeys>> | null = null;

  /** mapsDir: where the maps are pinned (pinLayout(pinRoot).maps in src/loader/manifest.ts). */
  constructor(readonly mapsDir: string) {
    const dir = mapsDir;
    try {
      for (const name of [MAP.pods, MAP.cidrs, MAP.ports, MAP.portranges, MAP.stats, MAP.dstslot, MAP.dstslot6, MAP.v6spill] as MapName[]) {
        // mc_portranges, mc_dstslot, mc_dstslot6 and mc_v6spill came later: a
        // datapath pinned by an older meshcap has none, and status,
        // uninstall and DEL must still work on it (a load of this version
        // adds them; a pod with ranges is refused until then, and its IPv6
        // connections all go to ::1)
        if (MAPS_ADDED_LATER.has(name) && !existsSync(path.join(dir, name))) continue;
        const fd = bpf.objGet(path.join(dir, name));
        this.fds.set(name, fd);
        const info = bpf.mapInfo(fd);
        this.keySizes.set(name, info.keySize);
        this.valueSizes.set(name, info.valueSize);
      }
    } catch (e) {
      this.close();
      throw new Error(`cannot open meshcap's pinned maps under ${dir}: ${(e as Error).message}. Is the datapath loaded (meshcap load)?`);
    }
  }

  close(): void {
    for (const fd of this.fds.values()) bpf.closeFd(fd);
    this.fds.clear();
    this.sweptMaps = undefined;
  }

  /**
   * True while the maps this object holds are the ones pinned: after an
   * uninstall or a recreated map the fds still work but point at maps no
   * program reads any more.
   */
  matchesPins(): boolean {
    const dir = this.mapsDir;
    for (const [name, fd] of this.fds) {
      let pinned: number;
      try {
        pinned = bpf.objGet(path.join(dir, name));
      } catch {
        return false;
      }
      try {
        if (bpf.mapInfo(pinned).id !== bpf.mapInfo(fd).id) return false;
      } finally {
        bpf.closeFd(pinned);
      }
    }
    return true;
  }

  /** Entries and capacity of each per-pod map (see EbpfBackend.fill). */
  fill(): { map: string; entries: number; maxEntries: number }[] {
    // mc_dstslot (up to 65,536 slots) is counted by batch reads, not a syscall per key
    const count = (map: string, fd: number) => (map === MAP.dstslot || map === MAP.dstslot6 ? bpf.mapEntries(fd).count : bpf.mapKeys(fd, this.keySizes.get(map as MapName)!).length);
    return [...this.fds].map(([map, fd]) => ({ map, entries: count(map, fd), maxEntries: bpf.mapInfo(fd).maxEntries }));
  }

  /** The swept maps this datapath has (an older one has no mc_portranges). */
  private get swept(): readonly MapName[] {
    // asked per pod by diff: the list is made once (the fds change only at close)
    return (this.sweptMaps ??= SWEPT_ALL.filter((m) => this.fds.has(m)));
  }

  private valueSize(name: MapName): number {
    return this.valueSizes.get(name)!;
  }

  private fd(name: MapName): number {
    const fd = this.fds.get(name);
    if (fd === undefined) throw new Error(`map ${name} is not open`);
    return fd;
  }

  /** Put the pod's entries in place; returns what was written. Idempotent. */
  write(netns: bigint, cfg: CaptureConfig, podIPs: string[]): PodEntries {
    const e = podEntries(netns, cfg, podIPs);
    if (e.ranges.length && !this.fds.has(MAP.portranges)) {
      throw new Error(`the eBPF datapath under ${this.mapsDir} predates port ranges (no ${MAP.portranges}): load this version's datapath (meshcap load, or restart the agent) before capturing a pod with long port lists`);
    }
    const index = this.podIndex();
    // The keys the pod has now, by map (a first ADD: none, so no key sets to build).
    const before = new Map<MapName, PackedKeys>();
    for (const m of this.swept) {
      const packed = index.get(m)!.get(netns);
      if (packed) before.set(m, packed);
    }
    // Keys this call inserts (not there before): undone if a map is full.
    let had: Set<string> | undefined;
    const isNew = (x: MapEntry): boolean => {
      if (before.size === 0) return true;
      if (!had) {
        had = new Set();
        for (const [m, packed] of before) for (const k of unpackKeys(packed, this.keySizes.get(m)!)) had.add(`${m}:${k.toString('latin1')}`);
      }
      return !had.has(`${x.map}:${x.key.toString('latin1')}`);
    };
    const keyed = keyedEntries(e);
    const inserted: MapEntry[] = [];
    const put = (x: MapEntry, flags = 0) => {
      try {
        bpf.mapUpdate(this.fd(x.map), x.key, x.value, flags);
      } catch (err) {
        const code = (err as { code?: string }).code ?? '';
        if (!FULL.has(code)) throw err;
        for (const y of inserted.reverse()) bpf.mapDelete(this.fd(y.map), y.key);
        const needed = [...keyed, e.stats, e.pod].filter((y) => y.map === x.map && isNew(y)).length;
        throw new MapFullError(x.map, bpf.mapInfo(this.fd(x.map)).maxEntries, needed, code);
      }
    };
    // Each map's keyed entries in one native call (one fd check for all of
    // them); where the kernel refuses one, put() repeats it alone and reports.
    for (const m of this.swept) {
      const list = keyed.filter((x) => x.map === m);
      for (let done = 0; done < list.length;) {
        const rest = done === 0 ? list : list.slice(done);
        const n = bpf.mapUpdateEach(this.fd(m), rest.map((x) => x.key), rest.map((x) => x.value));
        for (const x of rest.slice(0, n)) if (isNew(x)) inserted.push(x);
        done += n;
        if (done < list.length) {
          const x = list[done++]!;
          put(x);
          if (isNew(x)) inserted.push(x);
        }
      }
    }
    // Counters survive a repeated ADD: only create them.
    try {
      put(e.stats, bpf.consts.BPF_NOEXIST);
      inserted.push(e.stats);
    } catch (err) {
      if ((err as { code?: string }).code !== 'EEXIST') throw err;
    }
    put(e.pod);
    // Drop entries of an earlier config of the same pod.
    const want = before.size === 0 ? undefined : new Set(keyed.map((x) => `${x.map}:${x.key.toString('latin1')}`));
    for (const m of this.swept) {
      const stale = want ? unpackKeys(before.get(m), this.keySizes.get(m)!).filter((key) => !want.has(`${m}:${key.toString('latin1')}`)) : [];
      this.deleteKeys(m, stale);
      const keys = keyed.filter((x) => x.map === m).map((x) => x.key);
      if (keys.length) index.get(m)!.set(netns, packKeys(keys));
      else index.get(m)!.delete(netns);
    }
    return e;
  }

  /** Remove every entry of the pod. Returns how many were removed. */
  remove(netns: bigint): number {
    let n = 0;
    if (bpf.mapDelete(this.fd(MAP.pods), u64Key(netns))) n++;
    const index = this.podIndex();
    for (const m of this.swept) {
      n += this.deleteKeys(m, this.indexed(m, netns));
      index.get(m)!.delete(netns);
    }
    if (bpf.mapDelete(this.fd(MAP.stats), u64Key(netns))) n++;
    if (this.removeV6Spill(netns)) n++;
    // Its destination slots stay: they answer for its connections as long
    // as its netns lives (EbpfBackend.sweepSlots).
    return n;
  }

  /**
   * mc_dstslot and mc_dstslot6 read whole (one batch read each; none on a
   * datapath older than them). Slots are the kernel's, so no index of them
   * is kept here.
   */
  slotEntries(): SlotEntries {
    const out: SlotEntries = [];
    for (const map of SLOT_MAPS) {
      const fd = this.fds.get(map);
      if (fd !== undefined) out.push({ map, e: bpf.mapEntries(fd) });
    }
    return out;
  }

  /** Removes the destination slots (both families) of the cookies `gone` says, from a read of the maps (slotEntries); returns how many. */
  removeSlots(gone: (cookie: bigint) => boolean, es = this.slotEntries()): number {
    let n = 0;
    for (const { map, e } of es) {
      const keys: Buffer[] = [];
      for (let i = 0; i < e.count; i++) {
        if (gone(e.keys.readBigUInt64LE(i * e.keySize))) keys.push(e.keys.subarray(i * e.keySize, (i + 1) * e.keySize));
      }
      n += this.deleteKeys(map, keys);
    }
    return n;
  }

  /** The datapath has IPv6 slots (a load of this version made mc_v6spill). */
  hasV6Slots(): boolean {
    return this.fds.has(MAP.v6spill) && this.fds.has(MAP.dstslot6);
  }

  /**
   * Marks the pod as one whose redirected IPv6 connections may take IPv6
   * slots past `at` open on ::1 (mc_v6spill; its lo must route 100::/64
   * already). An entry there stays as it is: its count is the kernel's.
   * 'created' or 'kept'; null on a datapath without the map. A full map
   * (it holds one entry per pod, as mc_pods: only a leak fills it) refuses
   * the pod with MapFullError.
   */
  writeV6Spill(netns: bigint, at: number): 'created' | 'kept' | null {
    const fd = this.fds.get(MAP.v6spill);
    if (fd === undefined) return null;
    try {
      bpf.mapUpdate(fd, u64Key(netns), mcV6Spill.encode({ open: 0n, at: BigInt(at) }), bpf.consts.BPF_NOEXIST);
      return 'created';
    } catch (err) {
      const code = (err as { code?: string }).code ?? '';
      if (code === 'EEXIST') return 'kept';
      if (FULL.has(code)) throw new MapFullError(MAP.v6spill, bpf.mapInfo(fd).maxEntries, 1, code);
      throw err;
    }
  }

  /** Removes the pod's mc_v6spill entry (true if there was one). */
  removeV6Spill(netns: bigint): boolean {
    const fd = this.fds.get(MAP.v6spill);
    return fd !== undefined && bpf.mapDelete(fd, u64Key(netns));
  }

  /** Removes the mc_v6spill entries of netns cookies `gone` says; returns how many. */
  removeV6SpillOf(gone: (cookie: bigint) => boolean): number {
    const fd = this.fds.get(MAP.v6spill);
    if (fd === undefined) return 0;
    const keys = bpf.mapKeys(fd, 8).filter((k) => gone(k.readBigUInt64LE(0)));
    return this.deleteKeys(MAP.v6spill, keys);
  }

  /** The pod's mc_v6spill entry, if any. */
  v6Spill(netns: bigint): McV6Spill | null {
    const fd = this.fds.get(MAP.v6spill);
    if (fd === undefined) return null;
    const v = bpf.mapLookup(fd, u64Key(netns), mcV6Spill.size);
    return v ? mcV6Spill.decode(v) : null;
  }

  /** The pod's destination slots: slot (low 24 bits of 127.x.y.z) -> the mc_slot value (tests). */
  slotsOf(netns: bigint, map: (typeof SLOT_MAPS)[number] = MAP.dstslot): Map<number, Buffer> {
    const out = new Map<number, Buffer>();
    const e = this.slotEntries().find((x) => x.map === map)?.e;
    for (let i = 0; i < (e?.count ?? 0); i++) {
      if (e!.keys.readBigUInt64LE(i * e!.keySize) !== netns) continue;
      out.set(e!.keys.readUInt32LE(i * e!.keySize + 8), Buffer.from(e!.values.subarray(i * e!.valueSize, (i + 1) * e!.valueSize)));
    }
    return out;
  }

  /**
   * Deletes the keys present in map m; returns how many were. Several in one
   * native call (one fd check; one BPF_MAP_DELETE_BATCH where the map type
   * has it, which LPM tries do not: there it tries once, then one by one).
   */
  private deleteKeys(m: MapName, keys: Buffer[]): number {
    if (keys.length === 0) return 0;
    if (keys.length === 1) return bpf.mapDelete(this.fd(m), keys[0]!) ? 1 : 0;
    return bpf.mapDeleteBatch(this.fd(m), keys);
  }

  private podIndex(): Map<MapName, Map<bigint, PackedKeys>> {
    if (this.index) return this.index;
    const index = new Map<MapName, Map<bigint, PackedKeys>>();
    for (const m of this.swept) index.set(m, new Map(packedKeysByCookie(bpf.mapEntries(this.fd(m)), NETNS_OFFSET[m]!)));
    this.index = index;
    return index;
  }

  /** The pod's keys in map m as the index holds them (none: empty). */
  private indexed(m: MapName, netns: bigint): Buffer[] {
    return unpackKeys(this.podIndex().get(m)!.get(netns), this.keySizes.get(m)!);
  }

  /** Every pod's entries, each map read whole (noBatch: by the key walk, as on kernels without batch lookup; tests). */
  snapshot(opts: { noBatch?: boolean } = {}): KeySnapshot {
    const read = (m: MapName) => bpf.mapEntries(this.fd(m), opts.noBatch ? { noBatch: true } : undefined);
    const snap: KeySnapshot = { keys: new Map(), pods: valuesByCookie(read(MAP.pods)), stats: valuesByCookie(read(MAP.stats)), ranges: new Map(), inboundSeen: new Set() };
    for (const m of this.swept) {
      const e = read(m);
      snap.keys.set(m, hexKeysByCookie(e, NETNS_OFFSET[m]!));
      if (m !== MAP.portranges) continue;
      for (let i = 0; i < e.count; i++) snap.ranges.set(e.keys.toString('hex', i * e.keySize, (i + 1) * e.keySize), e.values.subarray(i * e.valueSize, (i + 1) * e.valueSize));
    }
    return snap;
  }

  /**
   * 'written', after write(): the snapshot takes the pod's entries as written
   * (write() throws if the kernel refused any). 'values': only its mc_pods and
   * mc_stats values, read again (a pass confirms a pod's drift with them: an
   * ADD may have rewritten the pod since the snapshot).
   */
  refreshSnapshot(snap: KeySnapshot, netns: bigint, what: 'written' | 'values' = 'written'): void {
    for (const m of what === 'written' ? this.swept : []) {
      const keys = this.indexed(m, netns);
      snap.keys.get(m)!.set(netns, new Set(keys.map((k) => k.toString('hex'))));
      if (m === MAP.portranges) {
        for (const k of keys) {
          const v = bpf.mapLookup(this.fd(m), k, this.valueSize(m));
          if (v) snap.ranges.set(k.toString('hex'), v);
        }
      }
    }
    const key = u64Key(netns);
    for (const [m, into, size] of [[MAP.pods, snap.pods, mcPod.size], [MAP.stats, snap.stats, mcStats.size]] as const) {
      const v = bpf.mapLookup(this.fd(m), key, size);
      if (v) into.set(netns, v);
      else into.delete(netns);
    }
  }

  keysOf(map: MapName, netns: bigint): Buffer[] {
    if (!this.fds.has(map)) return [];
    return bpf.mapKeys(this.fd(map), this.keySizes.get(map)!).filter((k) => netnsOfKey(map, k) === netns);
  }

  pod(netns: bigint): McPod | null {
    const v = bpf.mapLookup(this.fd(MAP.pods), u64Key(netns), mcPod.size);
    return v ? mcPod.decode(v) : null;
  }

  stats(netns: bigint): McStats | null {
    const v = bpf.mapLookup(this.fd(MAP.stats), u64Key(netns), mcStats.size);
    return v ? mcStats.decode(v) : null;
  }

  /** mc_pods by cookie, read by batch (pods() walks key by key). */
  podsByCookie(): CookieMap<Buffer> {
    return valuesByCookie(bpf.mapEntries(this.fd(MAP.pods)));
  }

  pods(): bigint[] {
    return bpf.mapKeys(this.fd(MAP.pods), 8).map((k) => k.readBigUInt64LE(0));
  }

  /** Every entry the pod should have that is missing or different (empty: all good). */
  diff(netns: bigint, cfg: CaptureConfig, podIPs: string[], snap?: KeySnapshot): string[] {
    const problems: string[] = [];
    const want = podValue(cfg, podIPs);
    const live = snap ? snap.pods.get(netns) : bpf.mapLookup(this.fd(MAP.pods), u64Key(netns), mcPod.size);
    if (!live) problems.push(`no ${MAP.pods} entry for netns cookie ${netns}`);
    else if (!live.equals(want)) problems.push(`${MAP.pods} entry for netns cookie ${netns} differs from the pod's config`);
    if (!(snap ? snap.stats.has(netns) : bpf.mapLookup(this.fd(MAP.stats), u64Key(netns), mcStats.size))) problems.push(`no ${MAP.stats} entry`);
    // The wanted keys as hex strings only: a pass over 10,000 pods calls this
    // for each, and the objects, closures and Sets it made per pod were ~15 MB
    // of its garbage (docs/bench-scale.md).
    const templates = keyTemplates(cfg);
    let mid: string | undefined;
    for (const m of this.swept) {
      const list = templates.get(m) ?? NO_TEMPLATES;
      const have = snap ? (snap.keys.get(m)!.get(netns) ?? NO_KEYS) : new Set(this.keysOf(m, netns).map((k) => k.toString('hex')));
      // most pods have nothing in some maps (no CIDR lists, no port ranges)
      if (list.length === 0 && have.size === 0) continue;
      mid ??= cookieHex(netns);
      const want = list.map((x) => x.before + mid + x.after);
      let missing = 0;
      for (const h of want) if (!have.has(h)) missing++;
      if (missing) problems.push(`${missing} ${m} entries missing`);
      let extra = 0;
      // a pod has a handful of keys per map: an array beats a Set
      for (const k of have) if (!want.includes(k)) extra++;
      if (extra) problems.push(`${extra} stale ${m} entries`);
      // A range's bounds are in its value, not its key.
      if (m === MAP.portranges) {
        let differs = 0;
        list.forEach((x, i) => {
          if (!have.has(want[i]!)) return;
          const v = snap ? snap.ranges.get(want[i]!) : bpf.mapLookup(this.fd(m), keyWithNetns(x.key, m, netns), x.value.length);
          if (!v?.equals(x.value)) differs++;
        });
        if (differs) problems.push(`${differs} ${m} entries with other bounds`);
      }
    }
    return problems;
  }
}
