// A running pod's network namespace without a CNI ADD (repair needs it for
// pods that started before meshcap-cni was in the chain): the pod's processes
// are found by the pod UID in their cgroup path, which every kubelet cgroup
// layout contains (cgroupfs: .../kubepods/burstable/pod<uid>/<container>;
// systemd: ...kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope),
// on cgroup v1 and v2 alike. The oldest such process (by start time) is the
// sandbox's pause process, whose netns is the pod's for the pod's whole life;
// its 64-hex cgroup leaf id is the sandbox id, i.e. the CNI container id.
//
// Chosen over matching the pod IP in every process's /proc/<pid>/net/fib_trie
// (reads a routing table per process, and IPv6 needs a second file) and over
// the CRI socket (one more hostPath mount and a gRPC client for one lookup).
// The pod IP is still checked in the found netns's fib_trie when the pod has
// an IPv4 address, so a wrong match (a reused pid) is refused, not repaired.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';

export interface PodNetns {
  pid: number;
  /** /proc/<pid>/ns/net: lives as long as the pause process, i.e. the pod sandbox. */
  netns: string;
  /** The sandbox id from the cgroup path, when it has one (the CNI container id). */
  sandboxId: string | null;
}

/** Whether a /proc/<pid>/cgroup text names this pod (its UID, dashed or systemd's underscored form). */
export function cgroupNamesPod(cgroupText: string, uid: string): boolean {
  const u = uid.toLowerCase();
  const underscored = u.replace(/-/g, '_');
  return cgroupText.split('\n').some((line) => {
    const p = line.slice(line.indexOf(':', line.indexOf(':') + 1) + 1).toLowerCase();
    return p.includes(`pod${u}`) || p.includes(`pod${underscored}`);
  });
}

/** The 64-hex container id at the end of a cgroup path (cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope or a bare <id>). */
export function containerIdOf(cgroupText: string): string | null {
  for (const line of cgroupText.split('\n')) {
    const leaf = line.split('/').pop() ?? '';
    const m = /(?:^|[-_])([0-9a-f]{64})(?:\.scope)?$/.exec(leaf);
    if (m) return m[1]!;
  }
  return null;
}

/** Whether fib_trie text lists `ip` as a local (/32 host LOCAL) address. */
export function fibTrieHasLocal(fibTrie: string, ip: string): boolean {
  const lines = fibTrie.split('\n');
  for (let i = 0; i < lines.length - 1; i++) {
    if (lines[i]!.trim().endsWith(` ${ip}`) || lines[i]!.trim() === `|-- ${ip}`) {
      if (/\/32 host LOCAL/.test(lines[i + 1]!)) return true;
    }
  }
  return false;
}

/** The start time of a process (field 22 of /proc/<pid>/stat, clock ticks since boot). */
function startTime(procRoot: string, pid: number): number {
  const stat = readFileSync(path.join(procRoot, String(pid), 'stat'), 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return Number(fields[19]);
}

/**
 * The netns of the pod with this UID, or null when no process of it runs
 * here or its netns is the host's (a hostNetwork pod). Throws when the pod's
 * IPv4 address is not local in that netns.
 */
export function findPodNetns(uid: string, o: { procRoot?: string; ipv4?: string } = {}): PodNetns | null {
  const procRoot = o.procRoot ?? '/proc';
  const host = statSync(path.join(procRoot, 'self/ns/net'));
  let best: { pid: number; start: number; cgroup: string } | undefined;
  for (const name of readdirSync(procRoot)) {
    if (!/^\d+$/.test(name)) continue;
    const pid = Number(name);
    try {
      const cgroup = readFileSync(path.join(procRoot, name, 'cgroup'), 'utf8');
      if (!cgroupNamesPod(cgroup, uid)) continue;
      const ns = statSync(path.join(procRoot, name, 'ns/net'));
      if (ns.ino === host.ino && ns.dev === host.dev) continue;
      const start = startTime(procRoot, pid);
      if (!best || start < best.start || (start === best.start && pid < best.pid)) best = { pid, start, cgroup };
    } catch {
      // exited while we looked, or a kernel thread
    }
  }
  if (!best) return null;
  const netns = path.join(procRoot, String(best.pid), 'ns/net');
  if (o.ipv4) {
    const fib = readFileSync(path.join(procRoot, String(best.pid), 'net/fib_trie'), 'utf8');
    if (!fibTrieHasLocal(fib, o.ipv4)) throw new Error(`process ${best.pid} has pod UID ${uid} in its cgroup, but its netns does not hold the pod IP ${o.ipv4}`);
  }
  return { pid: best.pid, netns, sandboxId: containerIdOf(best.cgroup) };
}
