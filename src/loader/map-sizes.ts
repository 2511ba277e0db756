// Sizes of the three LRU maps, of mc_dstslot and of mc_listen, chosen at
// load (docs/datapath.md, "Map sizes and memory"): the rest of meshcap.h's
// maps keep their compiled sizes. Preallocated LRU hashes are charged in
// full to the loader's cgroup whether used or not, so their size is a memory
// decision made per node; mc_dstslot's and mc_listen's bucket arrays are
// too. mc_dstslot's size is how many (pod, destination) pairs get a slot
// before new destinations take the socket-storage way; mc_listen's is how
// many proxy listening sockets the node can steer to (one per socket of a
// SO_REUSEPORT group, up to 4 per listener): a listener with no room is not
// reachable, and the pod's captured inbound connections are refused.

/** The maps whose max_entries `meshcap load` / `meshcap agent` set before load. */
export const SIZED_MAPS = ['mc_origdst', 'mc_sockorig', 'mc_dnsorig', 'mc_dstslot', 'mc_listen'] as const;
export type SizedMap = (typeof SIZED_MAPS)[number];
export type MapSizes = Record<SizedMap, number>;

/**
 * Defaults (the arithmetic is in docs/datapath.md): mc_origdst = 32,768
 * connects/s x 1 s x 2; mc_sockorig lives inside one connect() call, so only
 * stale entries and per-CPU free lists need room; mc_dnsorig = DNS sockets
 * used within a resolver's 5 s timeout, 13,107/s x 5 s; mc_dstslot = 65,536
 * (pod, destination) pairs, e.g. 100 pods x 655 destinations each;
 * mc_listen = 65,536 listening sockets: every pod mc_pods holds (16,384)
 * with an Envoy of 2 workers (Istio's default) on IPv4, 4 sockets each
 * (inbound and outbound port), or 10,922 such pods dual-stack (6 each).
 */
export const DEFAULT_MAP_SIZES: Readonly<MapSizes> = { mc_origdst: 65_536, mc_sockorig: 16_384, mc_dnsorig: 65_536, mc_dstslot: 65_536, mc_listen: 65_536 };

/** Below this the LRU's per-CPU free lists (128 entries per CPU) take most of the map. */
export const MIN_MAP_ENTRIES = 1_024;
/** 4,194,304 entries of mc_origdst are about 600 MB of kernel memory: beyond that is a typo. */
export const MAX_MAP_ENTRIES = 4_194_304;

/** The CLI option of each map. */
export const MAP_SIZE_OPTION: Readonly<Record<SizedMap, string>> = {
  mc_origdst: '--origdst-entries',
  mc_sockorig: '--sockorig-entries',
  mc_dnsorig: '--dnsorig-entries',
  mc_dstslot: '--dstslot-entries',
  mc_listen: '--listen-entries',
};

/** Parses one option value; throws an Error naming the option and the allowed range. */
export function parseMapEntries(option: string, value: string): number {
  const n = /^[0-9]+$/.test(value.trim()) ? Number(value.trim()) : NaN;
  if (!Number.isSafeInteger(n) || n < MIN_MAP_ENTRIES || n > MAX_MAP_ENTRIES) {
    throw new Error(
      `${option} ${JSON.stringify(value)} is not a number of entries between ${MIN_MAP_ENTRIES} and ${MAX_MAP_ENTRIES} ` +
        '(any integer in that range; docs/datapath.md "Map sizes and memory" says how to size it)',
    );
  }
  return n;
}

/** Options as commander gives them (strings, defaults filled in) -> sizes. */
export function mapSizesFromOptions(o: { origdstEntries: string; sockorigEntries: string; dnsorigEntries: string; dstslotEntries: string; listenEntries: string }): MapSizes {
  return {
    mc_origdst: parseMapEntries(MAP_SIZE_OPTION.mc_origdst, o.origdstEntries),
    mc_sockorig: parseMapEntries(MAP_SIZE_OPTION.mc_sockorig, o.sockorigEntries),
    mc_dnsorig: parseMapEntries(MAP_SIZE_OPTION.mc_dnsorig, o.dnsorigEntries),
    mc_dstslot: parseMapEntries(MAP_SIZE_OPTION.mc_dstslot, o.dstslotEntries),
    mc_listen: parseMapEntries(MAP_SIZE_OPTION.mc_listen, o.listenEntries),
  };
}

/** What a load did with each sized map. */
export interface MapSizeState {
  name: SizedMap;
  /** the size the map has now */
  maxEntries: number;
  /** the size asked for */
  requested: number;
  /** true: the map was already pinned and kept its size */
  pinned: boolean;
}

/** The line `meshcap load` prints and the agent logs for a pinned map of another size. */
export const adoptedSizeMessage = (s: MapSizeState) =>
  `${s.name} is pinned with ${s.maxEntries} entries and keeps them (${s.requested} asked for): ` +
  'the new size applies once the datapath is recreated (meshcap uninstall, then meshcap load; or a reboot)';
