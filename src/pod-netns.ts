// A pod's network namespace, as both datapath backends (src/pod-datapath/)
// and the iptables library (src/fallback-iptables/apply.ts) see it: its
// cookie (the pod's identity in eBPF mode, and the proof that a recorded path
// still names the same netns), whether it still lives, and the ::6 address
// the proxy's IPv6 inbound passthrough binds.
import { existsSync } from 'node:fs';
import * as bpf from './native/addon.js';

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
 * so does meshcap, in both modes.
 */
export async function addPassthroughV6(netnsPath: string): Promise<void> {
  // execa loaded here: `meshcap status` and the agent's start need none of it (~100 ms)
  const { execa } = await import('execa');
  const r = await execa('nsenter', [`--net=${netnsPath}`, 'ip', '-6', 'addr', 'replace', '::6/128', 'dev', 'lo'], { reject: false });
  if (r.exitCode !== 0) throw new Error(`cannot add ::6/128 to lo in ${netnsPath} (IPv6 inbound passthrough): ${r.stderr.trim()}`);
}
