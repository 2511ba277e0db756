// Load, attach, pin, adopt and remove the node-wide datapath.
//
// Programs attach at the cgroup v2 root through bpf_link, and links and maps
// are pinned under one pin root, so traffic keeps flowing while the agent is
// down. Loading again adopts what is pinned: an identical program keeps its
// link (same link id); a newer build replaces the program inside the existing
// link with bpf_link_update, so there is never a moment without a program.
import { existsSync, lstatSync, mkdirSync, readdirSync, rmdirSync, statSync, unlinkSync } from 'node:fs';
import path from 'node:path';
import * as bpf from '../native/addon.js';
import { bpfFdKind, readFdinfo } from './fdinfo.js';
import { LEGACY_MAPS, NODE_OBJECTS, objectPath, pinLayout } from './manifest.js';
import { cgroupPrograms, describeForeignBefore, foreignBefore } from './cgroup-order.js';
import { cgroup2OrThrow, ensureBpffs } from './mounts.js';
import type { OptionalFeature } from './features.js';
import { probeOptionalFeatures } from './probe.js';
import { DEFAULT_MAP_SIZES, SIZED_MAPS, type MapSizes, type MapSizeState } from './map-sizes.js';
import { pinnedMaxEntries, setMapSizes } from './pinned-map-sizes.js';
import { loadInboundShared, type InboundSharedState } from './inbound-shared.js';

export interface LinkState {
  name: string;
  pin: string;
  linkId: number;
  progId: number;
  progTag: string;
  /** what this load did with it */
  action: 'created' | 'adopted' | 'replaced';
}

export interface LoadResult {
  pinRoot: string;
  cgroup: string;
  links: LinkState[];
  /** Pins of an older meshcap's splice (LEGACY_MAPS) this load removed. */
  removedLegacy: string[];
  /** Optional features (OPTIONAL_FEATURES) this kernel has: the programs' .rodata flags follow them. */
  optional: Record<OptionalFeature, boolean>;
  /** Optional objects this kernel refused, with the reason (their features are unavailable). */
  unavailable: { file: string; reason: string }[];
  /** Foreign programs that run before meshcap's on connect4/6 (see cgroup-order.ts), one line each; empty when none. */
  orderWarnings: string[];
  /** The LRU maps' sizes: asked for, and what they are (a pinned map keeps its own). */
  mapSizes: MapSizeState[];
  /** The shared inbound program in slot 0 of mc_inbound_tail (inbound-shared.ts); null when this kernel refused it (pods then get a whole mc_inbound each, listed in unavailable). */
  inbound: InboundSharedState | null;
}

/** A pin under our root that is not what meshcap would have put there. */
export class ForeignPinError extends Error {
  constructor(readonly pin: string, detail: string) {
    super(`${pin}: ${detail}. meshcap will not overwrite it: remove it by hand if it is stale (rm ${pin}) or choose another --pin-root`);
    this.name = 'ForeignPinError';
  }
}

function withFd<T>(fd: number, f: (fd: number) => T): T {
  try {
    return f(fd);
  } finally {
    bpf.closeFd(fd);
  }
}

/** Check a pinned link is a cgroup link of the expected attach type, on the expected cgroup. */
function inspectPinnedLink(pin: string, attachType: number, cgroupId: bigint): { fd: number; info: Record<string, string> } {
  const fd = bpf.objGet(pin);
  const info = readFdinfo(fd);
  const kind = bpfFdKind(info);
  if (kind !== 'link') {
    bpf.closeFd(fd);
    throw new ForeignPinError(pin, `expected a pinned bpf_link, found a ${kind}`);
  }
  const li = bpf.linkInfo(fd);
  if (li.attachType !== null && li.attachType !== attachType) {
    bpf.closeFd(fd);
    throw new ForeignPinError(pin, `link has attach type ${li.attachType}, expected ${attachType}`);
  }
  if (li.cgroupId !== null && li.cgroupId !== cgroupId) {
    bpf.closeFd(fd);
    throw new ForeignPinError(pin, `link is attached to cgroup id ${li.cgroupId}, not the cgroup v2 root (id ${cgroupId})`);
  }
  return { fd, info };
}

/**
 * Unpin what an older meshcap pinned for its sk_msg splice (LEGACY_MAPS).
 * Called after the new sockops program is in place, so nothing adds sockets
 * to mc_splice any more. Only the pins go: the map's verdict is released with
 * its last pin, and a connection still spliced keeps its own copy of the
 * verdict until it closes (deleting its entry would drop the bytes queued in
 * its psock). Returns the pins removed.
 */
export function removeLegacyPins(pinRoot: string): string[] {
  const removed: string[] = [];
  for (const name of LEGACY_MAPS) {
    const pin = path.join(pinLayout(pinRoot).maps, name);
    if (!existsSync(pin)) continue;
    unlinkSync(pin);
    removed.push(pin);
  }
  return removed;
}

/**
 * The size each sized map gets at this load: a map already pinned keeps its
 * size (libbpf reuses a pin only when max_entries matches, and replacing a
 * live map would drop the connections in flight), others get what was asked.
 */
export function effectiveMapSizes(mapsDir: string, requested: MapSizes): MapSizeState[] {
  return SIZED_MAPS.map((name) => {
    const pin = path.join(mapsDir, name);
    let pinned: number | null;
    try {
      pinned = pinnedMaxEntries(pin);
    } catch (e) {
      throw new ForeignPinError(pin, (e as Error).message);
    }
    return { name, maxEntries: pinned ?? requested[name], requested: requested[name], pinned: pinned !== null };
  });
}

/**
 * objectDir: where the .bpf.o files are (default: this package's build/bpf).
 * mapSizes: the sized maps' sizes (default DEFAULT_MAP_SIZES); maps already
 * pinned keep theirs (LoadResult.mapSizes says which).
 */
export async function loadDatapath(opts: { pinRoot: string; objectDir?: string; mapSizes?: Partial<MapSizes> }): Promise<LoadResult> {
  await ensureBpffs();
  const L = pinLayout(opts.pinRoot);
  // Nothing of a datapath under the pin root yet: a load that fails part way
  // takes back what it pinned and attached (programs at the cgroup root with
  // no datapath behind them), instead of leaving them for an uninstall. A
  // load over an existing datapath leaves it as it is: it keeps running.
  const empty = (d: string) => !existsSync(d) || readdirSync(d).length === 0;
  const fresh = [L.maps, L.links, L.pods, L.progs].every(empty);
  try {
    return await loadInto(opts, L);
  } catch (e) {
    if (fresh) {
      try {
        uninstallDatapath(opts.pinRoot);
      } catch {
        // the load's own error is the one to report
      }
    }
    throw e;
  }
}

async function loadInto(opts: { pinRoot: string; objectDir?: string; mapSizes?: Partial<MapSizes> }, L: ReturnType<typeof pinLayout>): Promise<LoadResult> {
  const cgroup = cgroup2OrThrow();
  const cgroupId = BigInt(statSync(cgroup).ino);
  for (const d of [L.root, L.maps, L.links, L.pods]) mkdirSync(d, { recursive: true });

  const links: LinkState[] = [];
  const unavailable: LoadResult['unavailable'] = [];
  const optional = probeOptionalFeatures();
  const mapSizes = effectiveMapSizes(L.maps, { ...DEFAULT_MAP_SIZES, ...opts.mapSizes });
  // objects whose every program is attached by this load (rodataAttached)
  const attached = new Set<string>();
  for (const spec of NODE_OBJECTS) {
    const obj = bpf.openObject(objectPath(spec.file, opts.objectDir), { mapPinDir: L.maps });
    try {
      setMapSizes(obj, mapSizes.map((s) => [s.name, s.maxEntries] as const));
      for (const [name, feature] of Object.entries(spec.rodata ?? {})) obj.setRodata(name, Buffer.from([optional[feature] ? 1 : 0]));
      for (const [name, file] of Object.entries(spec.rodataAttached ?? {})) obj.setRodata(name, Buffer.from([attached.has(file) ? 1 : 0]));
      try {
        await obj.load();
      } catch (e) {
        if (!spec.optional) throw e;
        unavailable.push({ file: spec.file, reason: (e as Error).message });
        continue;
      }
      const progs = new Map(obj.programs().map((p) => [p.name, p]));
      for (const cp of spec.cgroup) {
        const prog = progs.get(cp.name);
        if (!prog) throw new Error(`${spec.file} has no program ${cp.name}: the build is out of date (npm run setup)`);
        const attachType = bpf.consts.attachType[cp.attachType];
        if (attachType === undefined) throw new Error(`unknown attach type ${cp.attachType}`);
        const newTag = bpf.progInfo(prog.fd).tag;
        const pin = L.link(cp.name);

        if (existsSync(pin)) {
          const { fd, info } = inspectPinnedLink(pin, attachType, cgroupId);
          withFd(fd, () => {
            let action: LinkState['action'] = 'adopted';
            if (info.prog_tag !== newTag) {
              bpf.linkUpdate(fd, prog.fd);
              action = 'replaced';
            }
            const li = bpf.linkInfo(fd);
            links.push({ name: cp.name, pin, linkId: li.id, progId: li.progId, progTag: newTag, action });
          });
        } else {
          const fd = bpf.linkCreateCgroup(prog.fd, cgroup, attachType);
          withFd(fd, () => {
            bpf.objPin(fd, pin);
            const li = bpf.linkInfo(fd);
            links.push({ name: cp.name, pin, linkId: li.id, progId: li.progId, progTag: newTag, action: 'created' });
          });
        }
      }
      attached.add(spec.file);
    } finally {
      obj.close();
    }
  }
  // After the node objects (the maps are pinned), before any pod's stub needs it.
  let inbound: InboundSharedState | null = null;
  try {
    inbound = await loadInboundShared(opts.pinRoot, mapSizes, opts.objectDir);
  } catch (e) {
    unavailable.push({ file: 'inbound-shared.bpf.o', reason: `${(e as Error).message} (each meshed pod gets its own whole inbound program instead)` });
  }
  const removedLegacy = removeLegacyPins(opts.pinRoot);
  const ours = new Set(links.map((l) => l.progId));
  let orderWarnings: string[];
  try {
    orderWarnings = foreignBefore(cgroupPrograms(cgroup), ours).map(describeForeignBefore);
  } catch (e) {
    // The datapath is loaded and works; only the order check could not run.
    orderWarnings = [`could not check which programs run before meshcap's on connect4/6 at ${cgroup}: ${(e as Error).message}`];
  }
  return { pinRoot: opts.pinRoot, cgroup, links, removedLegacy, optional, unavailable, orderWarnings, mapSizes, inbound };
}

export interface UninstallResult {
  detached: string[];
  unpinned: string[];
  leftBehind: string[];
}

const OUR_NAME = /^(mc_[a-z0-9_]+|inbound)$/;

/**
 * Detach and unpin everything meshcap pinned under the pin root, and nothing
 * else: a pin whose name meshcap never uses is reported and left in place.
 */
export function uninstallDatapath(pinRoot: string): UninstallResult {
  const res: UninstallResult = { detached: [], unpinned: [], leftBehind: [] };
  if (!existsSync(pinRoot)) return res;
  const L = pinLayout(pinRoot);

  const removePin = (pin: string) => {
    const name = path.basename(pin);
    if (!OUR_NAME.test(name)) {
      res.leftBehind.push(pin);
      return;
    }
    let fd = -1;
    try {
      fd = bpf.objGet(pin);
      if (bpfFdKind(readFdinfo(fd)) === 'link') {
        // Detach even if someone else holds the link open.
        bpf.linkDetach(fd);
        res.detached.push(pin);
      }
    } catch {
      // Not a BPF object (or already gone): handled by unlink below.
    } finally {
      if (fd >= 0) bpf.closeFd(fd);
    }
    unlinkSync(pin);
    res.unpinned.push(pin);
  };

  const sweep = (dir: string, depth: number) => {
    if (!existsSync(dir)) return;
    for (const e of readdirSync(dir)) {
      const p = path.join(dir, e);
      if (lstatSync(p).isDirectory()) {
        if (depth > 0) sweep(p, depth - 1);
        else res.leftBehind.push(p);
        tryRmdir(p, res);
      } else {
        removePin(p);
      }
    }
  };
  // Links before maps: no program may run against a half-removed map set.
  sweep(L.links, 0);
  sweep(L.pods, 1);
  sweep(L.progs, 0);
  sweep(L.maps, 0);
  for (const d of [L.links, L.pods, L.progs, L.maps]) tryRmdir(d, res);
  for (const e of readdirSync(L.root)) {
    const p = path.join(L.root, e);
    if (!res.leftBehind.includes(p)) res.leftBehind.push(p);
  }
  tryRmdir(L.root, res);
  return res;
}

function tryRmdir(dir: string, res: UninstallResult) {
  if (!existsSync(dir)) return;
  if (readdirSync(dir).length === 0) rmdirSync(dir);
  else if (!res.leftBehind.some((p) => p.startsWith(dir + '/')) && !res.leftBehind.includes(dir)) res.leftBehind.push(dir);
}
