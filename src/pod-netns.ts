// A pod's network namespace, as both datapath backends (src/pod-datapath/)
// and the iptables library (src/fallback-iptables/apply.ts) see it: its
// cookie (the pod's identity in eBPF mode, and the proof that a recorded path
// still names the same netns), whether it still lives, and the ::6 address
// the proxy's IPv6 inbound passthrough binds.
import { existsSync } from 'node:fs';
import * as bpf from './native/addon.js';
import { isNativeError } from './native/errors.js';

/** Whether a record's netns path still names the netns it was made for. */
export type NetnsState = 'live' | 'gone' | 'replaced';

/** The identity both the agent and the kernel programs compute (SO_NETNS_COOKIE / bpf_get_netns_cookie). */
export function netnsCookie(netnsPath: string): Promise<bigint> {
  return bpf.netnsCookie(netnsPath);
}

/** The cookie of the netns at `netnsPath` now; 'gone' if there is none; null if the kernel cannot tell. */
export async function liveCookie(netnsPath: string): Promise<bigint | null | 'gone'> {
  if (netnsPath === '' || !existsSync(netnsPath)) return 'gone';
  try {
    return await netnsCookie(netnsPath);
  } catch (err) {
    // A leftover file that is no longer a netns mount.
    if (/ENOENT|EINVAL|not a network namespace/i.test((err as Error).message)) return 'gone';
    return null;
  }
}

export async function netnsState(netnsPath: string, cookie: bigint | null): Promise<NetnsState> {
  const live = await liveCookie(netnsPath);
  if (live === 'gone') return 'gone';
  return cookie !== null && live !== null && live !== cookie ? 'replaced' : 'live';
}

/** Why the recorded netns cannot be checked (gone, or the path names another one now), or undefined. */
export async function netnsProblem(netnsPath: string, cookie: bigint | null): Promise<string | undefined> {
  const live = await liveCookie(netnsPath);
  if (live === 'gone') return `network namespace ${netnsPath} does not exist`;
  if (cookie !== null && live !== null && live !== cookie) return `${netnsPath} is now a different network namespace (cookie ${live}, recorded ${cookie})`;
  return undefined;
}

/**
 * The proxy's inbound passthrough binds ::6 for IPv6 (127.0.0.6 for IPv4 is on
 * lo already); Istio adds ::6/128 to the pod's lo (tproxy.ConfigureRoutes), and
 * so does meshcap, in both modes. With slotRoute (eBPF mode, IPv6 captured),
 * also the route of IPv6 destination slots, 100::/64 to lo (bpf/include/meshcap.h):
 * one exec for both.
 */
export async function addPassthroughV6(netnsPath: string, opts: { slotRoute?: boolean } = {}): Promise<void> {
  // execa loaded here: `meshcap status` and the agent's start need none of it (~100 ms)
  const { execa } = await import('execa');
  // a route needs its device up: the runtime's loopback setup brings lo up
  // anyway, but its order against the CNI chain is the runtime's
  const slot = opts.slotRoute ? ['link set dev lo up', `route replace local ${V6_SLOT_PREFIX} dev lo`] : [];
  const batch = ['addr replace ::6/128 dev lo', ...slot].join('\n') + '\n';
  const r = await execa('nsenter', [`--net=${netnsPath}`, 'ip', '-6', '-batch', '-'], { input: batch, reject: false });
  if (r.exitCode !== 0) {
    const what = opts.slotRoute ? `::6/128 to lo (IPv6 inbound passthrough) or the route of IPv6 destination slots (local ${V6_SLOT_PREFIX} dev lo)` : '::6/128 to lo (IPv6 inbound passthrough)';
    throw new Error(`cannot add ${what} in ${netnsPath}: ${r.stderr.trim()}`);
  }
}

/** Where IPv6 destination slots live in a pod: RFC 6666's discard-only prefix, routed to lo (bpf/include/meshcap.h). */
export const V6_SLOT_PREFIX = '100::/64';

/** The pod's ephemeral port range, [low, high], as its netns has it (net.ipv4.ip_local_port_range, IPv6's too). */
export async function ephemeralPorts(netnsPath: string): Promise<[number, number]> {
  const text = await bpf.netnsReadSysctl(netnsPath, '/proc/sys/net/ipv4/ip_local_port_range');
  const m = /^\s*(\d+)\s+(\d+)\s*$/.exec(text);
  if (!m) throw new Error(`${netnsPath}: net.ipv4.ip_local_port_range reads ${JSON.stringify(text)}, not two ports`);
  return [Number(m[1]), Number(m[2])];
}

/**
 * From how many redirected IPv6 connections open on [::1] a pod's next ones
 * take slots: half its ephemeral range, so ::1's one range never runs out
 * first (the other half covers TIME_WAIT ports not yet reusable, which need
 * a second), and never below 1.
 */
export function v6SpillAt([low, high]: [number, number]): number {
  return Math.max(1, Math.floor((high - low + 1) / 2));
}

/**
 * The replies' route that eBPF-mode builds from 0b6b34f to eed882e (2026-11-30
 * 17:09-20:40 UTC) added at ADD: `local <pod IPv4> dev lo` in table 15001,
 * looked up by `pref 0 from 127.0.0.0/8 to <pod IPv4> ipproto tcp` ahead of
 * the local table. It made the proxy's replies to the pod's address take a
 * route the kernel caches, but a rule in a netns sends every route lookup
 * there through the rules and splits the local and main tables, which cost
 * the whole path (the proxy's upstream connections and the pod's interface)
 * more than the replies gained (docs/bench-datapath.md, "The replies' route,
 * taken back"). No build adds it any more; unregister takes it out of a pod
 * that has it.
 */
export const REPLY_ROUTE_TABLE = 15001;
/** The route protocol those reply routes carry (`ip route show table 15001` says `proto 109`). */
export const REPLY_ROUTE_PROTOCOL = 109;

/**
 * Takes the replies' route (above) out of a pod an earlier build gave it; a
 * pod without it (one dump of its rules, which needs no CAP_NET_ADMIN), or a
 * netns that is gone, has nothing to take out.
 */
export function removeReplyRoutes(netnsPath: string, podIPs: readonly string[]): void {
  const v4 = podIPs.filter((ip) => !ip.includes(':'));
  if (v4.length === 0 || !existsSync(netnsPath)) return;
  try {
    bpf.netnsReplyRoutes(netnsPath, 'remove', v4, REPLY_ROUTE_TABLE, REPLY_ROUTE_PROTOCOL);
  } catch (e) {
    // gone between the look and the open, or a path no longer a netns (its bind mount gone)
    if (isNativeError(e) && (e.syscall === 'open' || e.syscall === 'setns') && (e.code === 'ENOENT' || e.code === 'EINVAL')) return;
    throw e;
  }
}
