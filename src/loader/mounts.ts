// Where cgroup v2 and bpffs are mounted, read from /proc/self/mountinfo: hosts
// differ (/sys/fs/cgroup on unified hosts, /sys/fs/cgroup/unified on hybrid
// ones), so nothing here assumes a path.
import { readFileSync, statfsSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';

export interface Mount {
  mountPoint: string;
  fsType: string;
  root: string;
}

/** Parse mountinfo text (proc(5)): fields before " - " then fstype and source. */
export function parseMountinfo(text: string): Mount[] {
  const mounts: Mount[] = [];
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    const sep = line.indexOf(' - ');
    if (sep < 0) continue;
    const pre = line.slice(0, sep).split(' ');
    const post = line.slice(sep + 3).split(' ');
    if (pre.length < 5 || post.length < 1) continue;
    mounts.push({ root: unescapeOctal(pre[3]!), mountPoint: unescapeOctal(pre[4]!), fsType: post[0]! });
  }
  return mounts;
}

function unescapeOctal(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
}

/**
 * The mounts of one filesystem type. A node's mountinfo has a line per pod
 * netns and container mount (11,000 lines at 10,000 pods): only that type's
 * lines are parsed.
 */
function readMounts(fsType: string): Mount[] {
  const text = readFileSync('/proc/self/mountinfo', 'utf8');
  return parseMountinfo(text.split('\n').filter((l) => l.includes(` - ${fsType} `)).join('\n'));
}

const BPF_FS_MAGIC = 0xcafe4a11;

/** The cgroup v2 mount whose root is the hierarchy root, or null. */
export function findCgroup2(mounts: Mount[] = readMounts('cgroup2')): string | null {
  const c = mounts.filter((m) => m.fsType === 'cgroup2');
  return (c.find((m) => m.root === '/') ?? c[0])?.mountPoint ?? null;
}

export function findBpffs(mounts?: Mount[]): string | null {
  // bpffs at its usual place, the answer the mounts would give, without
  // reading them (statfs: one syscall instead of the node's mount table)
  if (!mounts) {
    try {
      if (statfsSync('/sys/fs/bpf').type === BPF_FS_MAGIC) return '/sys/fs/bpf';
    } catch {
      // no /sys/fs/bpf: the mounts say where bpffs is, if anywhere
    }
  }
  const b = (mounts ?? readMounts('bpf')).filter((m) => m.fsType === 'bpf');
  return (b.find((m) => m.mountPoint === '/sys/fs/bpf') ?? b[0])?.mountPoint ?? null;
}

export function cgroup2OrThrow(): string {
  const p = findCgroup2();
  if (!p) {
    throw new Error('no cgroup v2 hierarchy is mounted (none in /proc/self/mountinfo): eBPF mode attaches at the cgroup v2 root; mount one (mount -t cgroup2 none /sys/fs/cgroup/unified) or use --mode iptables');
  }
  return p;
}

/** Mount bpffs at /sys/fs/bpf when no bpffs is mounted; return the mount point. */
export async function ensureBpffs(): Promise<string> {
  const found = findBpffs();
  if (found) return found;
  await mkdir('/sys/fs/bpf', { recursive: true });
  const { execa } = await import('execa'); // only here: the commands that read mounts need no execa
  await execa('mount', ['-t', 'bpf', 'bpf', '/sys/fs/bpf']);
  const now = findBpffs();
  if (!now) throw new Error('mounted bpffs at /sys/fs/bpf but it does not show in /proc/self/mountinfo');
  return now;
}
