// The sizes of the LRU maps already pinned (SIZED_MAPS). libbpf reuses a
// pinned map only when the object's max_entries equals the pin's, and the
// sizes are chosen per node at load, so every object opened against the pins
// takes each sized map's size from its pin before load.
import { existsSync } from 'node:fs';
import path from 'node:path';
import * as bpf from '../native/addon.js';
import { SIZED_MAPS, type SizedMap } from './map-sizes.js';

/** max_entries of the map pinned at pin; null when nothing is pinned there. Throws naming the pin if it is not a readable map. */
export function pinnedMaxEntries(pin: string): number | null {
  if (!existsSync(pin)) return null;
  const fd = bpf.objGet(pin);
  try {
    return bpf.mapInfo(fd).maxEntries;
  } catch (e) {
    throw new Error(`${pin}: not a BPF map meshcap can read the size of: ${(e as Error).message}`);
  } finally {
    bpf.closeFd(fd);
  }
}

/** The sized maps pinned in mapsDir and their max_entries (read once by a caller that opens many objects). */
export function pinnedSizes(mapsDir: string): Map<SizedMap, number> {
  const sizes = new Map<SizedMap, number>();
  for (const name of SIZED_MAPS as readonly SizedMap[]) {
    const n = pinnedMaxEntries(path.join(mapsDir, name));
    if (n !== null) sizes.set(name, n);
  }
  return sizes;
}

/** Before load: each sized map of obj that is pinned gets the pin's size (read from mapsDir, or given as read by pinnedSizes). */
export function adoptPinnedSizes(obj: bpf.BpfObject, pins: string | ReadonlyMap<SizedMap, number>): void {
  setMapSizes(obj, typeof pins === 'string' ? pinnedSizes(pins) : pins);
}

/** Before load: each of the named maps that obj has gets its size (objects carry only some of the node's maps). */
export function setMapSizes(obj: bpf.BpfObject, sizes: Iterable<readonly [string, number]>): void {
  const inObject = new Set(obj.maps().map((m) => m.name));
  for (const [name, n] of sizes) if (inObject.has(name)) obj.setMaxEntries(name, n);
}
