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

/** Before load: each sized map of obj that is pinned in mapsDir gets the pin's size. */
export function adoptPinnedSizes(obj: bpf.BpfObject, mapsDir: string): void {
  const inObject = new Set(obj.maps().map((m) => m.name));
  for (const name of SIZED_MAPS as readonly SizedMap[]) {
    if (!inObject.has(name)) continue;
    const n = pinnedMaxEntries(path.join(mapsDir, name));
    if (n !== null) obj.setMaxEntries(name, n);
  }
}
