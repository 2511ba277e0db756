// A pod that does not fit: the refusal an operator reads when one of the
// node-wide eBPF maps is full. No addon import, so handlers and metrics can
// recognise it without loading the native code.
import { MAP } from './layout.js';

/** What each per-pod map holds, for an operator reading a refusal. */
const HOLDS: Record<string, string> = {
  [MAP.pods]: 'one entry per meshed eBPF pod: the node\'s eBPF pod capacity',
  [MAP.stats]: 'one counter entry per meshed eBPF pod: the node\'s eBPF pod capacity',
  [MAP.cidrs]: 'the node-wide table of every pod\'s include/exclude outbound IP ranges and DNS servers',
  [MAP.ports]: 'the node-wide table of every pod\'s include/exclude port lists',
  [MAP.portranges]: 'the node-wide table of every pod\'s wide port ranges',
  [MAP.v6spill]: 'one entry per meshed eBPF pod whose IPv6 is captured: the node\'s eBPF pod capacity',
};

/**
 * A pod's entries do not fit: the kernel refused an insert into a full map
 * (E2BIG for hash maps, ENOSPC for the LPM trie). Nothing of the pod is left
 * written (write() undoes its own inserts), so the pod is refused, never
 * half-captured.
 */
export class MapFullError extends Error {
  override readonly name = 'MapFullError';
  constructor(readonly map: string, readonly maxEntries: number, readonly needed: number, readonly errno: string) {
    super(
      `eBPF map ${map} is full (${errno}): it holds at most ${maxEntries} entries (${HOLDS[map] ?? 'node-wide'}) and this pod needs ${needed} more. ` +
        'Nothing of the pod was written. To place it: run fewer meshed pods on this node (drain some, or lower its maxPods), ' +
        (map === MAP.cidrs || map === MAP.ports || map === MAP.portranges ? 'shorten the long IP-range or port lists of the pods on it, ' : '') +
        'or run this node in iptables mode (meshcap agent --mode iptables). meshcap_bpf_map_entries / meshcap_bpf_map_max_entries show the fill.',
    );
  }
}

/**
 * A running proxy's listening socket that mc_listen has no room for: nothing
 * steers the pod's captured inbound connections to it, so they are refused
 * (never sent around the proxy) until there is room.
 */
export class ListenMapFullError extends Error {
  override readonly name = 'ListenMapFullError';
  constructor(readonly maxEntries: number, readonly family: 4 | 6, readonly port: number, readonly errno: string) {
    super(
      `eBPF map ${MAP.listen} is full (${errno}): it holds at most ${maxEntries} listening sockets of meshed pods' proxies ` +
        `(one per SO_REUSEPORT socket, up to 4 per listener), and this pod's proxy listener on IPv${family} port ${port} has none, ` +
        'so its captured inbound connections are refused. To make room: raise --listen-entries (Helm mapEntries.listen; it applies ' +
        'when the datapath is recreated: meshcap uninstall, then meshcap load, or a reboot), or run fewer meshed pods or fewer proxy ' +
        `worker threads on this node. meshcap_bpf_map_entries{map="${MAP.listen}"} / meshcap_bpf_map_max_entries show the fill.`,
    );
  }
}

/** errno codes of an insert into a full map: hash maps E2BIG, the LPM trie ENOSPC. */
export const FULL = new Set(['E2BIG', 'ENOSPC']);
