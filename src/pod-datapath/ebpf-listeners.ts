// Re-registers a running proxy's inbound listener in mc_listen. sockops fills
// mc_listen only when the proxy calls listen(); when the maps are recreated
// under a running proxy (an upgrade that changes a map, uninstall then load)
// nothing would fill it again and every captured inbound connection would be
// refused until the proxy restarts. The listener is found the way ss(8) would
// (/proc/<pid>/net/tcp{,6} of a process in the pod's netns, state LISTEN on
// the inbound port), its fd is duplicated out of the proxy with pidfd_getfd,
// and put into the sockhash from here.
import { existsSync, readdirSync, readFileSync, readlinkSync, statSync } from 'node:fs';
import path from 'node:path';
import * as bpf from '../native/addon.js';
import { MAP, MC_LISTEN_SLOTS, mcListenKey } from '../maps/layout.js';
import { FULL, ListenMapFullError } from '../maps/map-full.js';
import { ListenerIndex } from './listener-index.js';
import { pinLayout } from '../loader/manifest.js';

/** Processes by the network namespace they live in ("dev:ino" of /proc/<pid>/ns/net). */
export type NetnsProcesses = Map<string, number[]>;

const nsId = (st: { dev: number | bigint; ino: number | bigint }) => `${st.dev}:${st.ino}`;

/** One pass over /proc: which processes live in which netns. Cheap enough per reconcile, not per pod. */
export function netnsProcesses(proc = '/proc'): NetnsProcesses {
  const byNs: NetnsProcesses = new Map();
  for (const e of readdirSync(proc)) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const id = nsId(statSync(path.join(proc, e, 'ns', 'net')));
      const pids = byNs.get(id);
      if (pids) pids.push(Number(e));
      else byNs.set(id, [Number(e)]);
    } catch {
      // exited meanwhile, or a kernel thread without a netns
    }
  }
  return byNs;
}

export interface ListeningSocket {
  inode: number;
  family: 4 | 6;
}

/**
 * TCP sockets in LISTEN (state 0A) on `port` in /proc/<pid>/net/tcp and tcp6
 * (the tables of the pid's netns). Exported for its unit test.
 */
export function parseListeners(table: string, family: 4 | 6, port: number): ListeningSocket[] {
  const out: ListeningSocket[] = [];
  for (const line of table.split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length < 10) continue;
    const local = f[1]!;
    const lport = parseInt(local.slice(local.lastIndexOf(':') + 1), 16);
    if (f[3] !== '0A' || lport !== port) continue;
    const inode = Number(f[9]);
    if (inode > 0) out.push({ inode, family });
  }
  return out;
}

function readTable(pid: number, name: 'tcp' | 'tcp6'): string {
  try {
    return readFileSync(`/proc/${pid}/net/${name}`, 'utf8');
  } catch {
    return '';
  }
}

/** The fd number under which `pid` holds socket `inode`, if it does. */
function fdOfSocket(pid: number, inode: number): number | null {
  const dir = `/proc/${pid}/fd`;
  let fds: string[];
  try {
    fds = readdirSync(dir);
  } catch {
    return null;
  }
  const want = `socket:[${inode}]`;
  for (const fd of fds) {
    try {
      if (readlinkSync(path.join(dir, fd)) === want) return Number(fd);
    } catch {
      // closed meanwhile
    }
  }
  return null;
}

/**
 * Which pods' listeners mc_listen holds (any slot), in one walk of the map:
 * a pass over every pod asks this once instead of looking up each pod's
 * slots (8 lookups for a pod with no proxy listening). The keys come packed
 * in one Buffer and go into a typed-array table (listener-index.ts): no
 * object, string or Buffer per key.
 */
export function listenerSnapshot(pinRoot: string): ListenerIndex {
  const fd = bpf.objGet(path.join(pinLayout(pinRoot).maps, MAP.listen));
  try {
    return new ListenerIndex().load(bpf.mapKeysPacked(fd, mcListenKey.size));
  } finally {
    bpf.closeFd(fd);
  }
}

/**
 * mc_listen's keys (listening sockets) and capacity, for the fill gauges: a
 * full map leaves proxies unreachable. Null while it is not pinned (a
 * datapath removed under the agent, until the self-check loads it again).
 */
export function listenerFill(pinRoot: string): { map: string; entries: number; maxEntries: number } | null {
  const pin = path.join(pinLayout(pinRoot).maps, MAP.listen);
  if (!existsSync(pin)) return null;
  const fd = bpf.objGet(pin);
  try {
    return { map: MAP.listen, entries: bpf.mapKeysPacked(fd, mcListenKey.size).length / mcListenKey.size, maxEntries: bpf.mapInfo(fd).maxEntries };
  } finally {
    bpf.closeFd(fd);
  }
}

export interface ListenerRefill {
  /** families whose key was already in mc_listen */
  present: (4 | 6)[];
  /** families registered by this call */
  registered: (4 | 6)[];
  /** families with no listener on the port in the pod (no proxy running, or not listening yet) */
  none: (4 | 6)[];
}

/**
 * Makes mc_listen hold the pod's inbound listener for each family that has
 * one on `port`: keys already present are left alone (sockops registered
 * them), missing ones are filled from the running proxy. Idempotent.
 */
export function refillPodListeners(opts: {
  pinRoot: string;
  netns: bigint;
  netnsPath: string;
  port: number;
  /** The /proc scan, asked for only when a key is missing (the common pass finds both present). */
  processes: () => NetnsProcesses;
  /** listenerSnapshot() of this pass: a family in it is present without a lookup; one not in it is looked up only if the pod has a listener to put back. */
  listening?: ListenerIndex;
}): ListenerRefill {
  const res: ListenerRefill = { present: [], registered: [], none: [] };
  let pidsOfNetns: number[] | undefined;
  const pidsOf = () => (pidsOfNetns ??= opts.processes().get(nsId(statSync(opts.netnsPath))) ?? []);
  // opened when a key is looked up or written (a pass over pods whose listeners
  // are all in the snapshot, or that have none, opens it for none of them)
  let fd: number | undefined;
  const mapFd = () => (fd ??= bpf.objGet(path.join(pinLayout(opts.pinRoot).maps, MAP.listen)));
  const key = (family: 4 | 6, slot: number) => mcListenKey.encode({ netns: opts.netns, port: opts.port, family, slot, pad: Buffer.alloc(4) });
  try {
    for (const family of [4, 6] as const) {
      if (opts.listening?.has(opts.netns, opts.port, family)) {
        res.present.push(family);
        continue;
      }
      // Every process of the netns sees the same tables; the owner of the fd may be any of them.
      const socketsOf = () => {
        const pids = pidsOf();
        return pids.length ? parseListeners(readTable(pids[0]!, family === 4 ? 'tcp' : 'tcp6'), family, opts.port) : [];
      };
      // Not in the snapshot: nothing to do unless the pod has a listener (no
      // lookups for a pod without a proxy); with one, the map decides (the
      // snapshot may predate sockops registering it). Without a snapshot the
      // map first, the /proc scan only when a key is missing.
      let sockets = opts.listening ? socketsOf() : undefined;
      let present = false;
      if (!opts.listening || sockets!.length > 0) {
        for (let slot = 0; slot < MC_LISTEN_SLOTS && !present; slot++) present = bpf.mapLookup(mapFd(), key(family, slot), 8) !== null;
      }
      if (present) {
        res.present.push(family);
        continue;
      }
      sockets ??= socketsOf();
      // Every listening socket on the port (a SO_REUSEPORT group has several),
      // one slot each, as sockops fills them when the proxy calls listen().
      let slot = 0;
      for (const s of sockets) {
        if (slot >= MC_LISTEN_SLOTS) break;
        for (const pid of pidsOf()) {
          const fd = fdOfSocket(pid, s.inode);
          if (fd === null) continue;
          const mine = bpf.takeFd(pid, fd);
          try {
            const value = Buffer.alloc(8);
            value.writeBigUInt64LE(BigInt(mine));
            bpf.mapUpdate(mapFd(), key(family, slot++), value);
          } catch (e) {
            const code = (e as { code?: unknown }).code;
            if (typeof code === 'string' && FULL.has(code)) throw new ListenMapFullError(bpf.mapInfo(mapFd()).maxEntries, family, opts.port, code);
            throw e;
          } finally {
            bpf.closeFd(mine);
          }
          break;
        }
      }
      (slot > 0 ? res.registered : res.none).push(family);
    }
  } finally {
    if (fd !== undefined) bpf.closeFd(fd);
  }
  return res;
}
