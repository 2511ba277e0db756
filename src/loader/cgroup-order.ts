// Other programs on the same cgroup hooks as meshcap's, in the order the
// kernel runs them. Multi-attached cgroup programs run in attach order, and
// a socket load balancer on connect4/6 (Cilium's, with socketLB at the host
// root) that runs before meshcap rewrites a service address to a backend
// first: the sidecar then sees the backend as the original destination,
// where Istio's iptables (which run after the app's connect()) see the
// service. meshcap cannot reorder another owner's links, so it says so.
import { execa } from 'execa';

export interface AttachedProgram {
  id: number;
  /** bpftool's attach type name, e.g. cgroup_inet4_connect */
  attachType: string;
  name: string;
}

/** The hooks where the order decides what the sidecar sees. */
export const ORDER_SENSITIVE = ['cgroup_inet4_connect', 'cgroup_inet6_connect'] as const;

/** Programs attached directly to `cgroup`, per hook in the order they run (bpftool cgroup show). */
export async function cgroupPrograms(cgroup: string): Promise<AttachedProgram[]> {
  const r = await execa('bpftool', ['cgroup', 'show', cgroup, '-j'], { reject: false });
  if (r.exitCode !== 0) throw new Error(`bpftool cgroup show ${cgroup} failed (${r.exitCode}): ${r.stderr.trim()}`);
  const list = JSON.parse(r.stdout || '[]') as { id: number; attach_type: string; name?: string }[];
  return list.map((p) => ({ id: p.id, attachType: p.attach_type, name: p.name ?? '' }));
}

/** meshcap's own programs (any instance: each acts only on the pods in its own maps). */
const isMeshcap = (p: AttachedProgram) => p.name.startsWith('mc_');

/**
 * Foreign programs that run before `ours` (the program ids of this
 * datapath's links) on each order-sensitive hook. Pure.
 */
export function foreignBefore(progs: AttachedProgram[], ours: ReadonlySet<number>): { hook: string; programs: AttachedProgram[] }[] {
  const out: { hook: string; programs: AttachedProgram[] }[] = [];
  for (const hook of ORDER_SENSITIVE) {
    const onHook = progs.filter((p) => p.attachType === hook);
    const first = onHook.findIndex((p) => ours.has(p.id));
    if (first < 0) continue;
    const before = onHook.slice(0, first).filter((p) => !isMeshcap(p));
    if (before.length) out.push({ hook, programs: before });
  }
  return out;
}

/** One line an operator can act on. */
export function describeForeignBefore(f: { hook: string; programs: AttachedProgram[] }): string {
  const names = f.programs.map((p) => `${p.name || '(unnamed)'} (prog id ${p.id})`).join(', ');
  return `${f.hook}: ${names} run${f.programs.length === 1 ? 's' : ''} before meshcap's program at the cgroup root, ` +
    'so a destination it rewrites (a socket load balancer turning a service address into a backend) is what the sidecar sees as the original destination, ' +
    'not the service Istio would show: restrict that program to the host netns (Cilium: socketLB.hostNamespaceOnly=true, which Istio requires anyway), ' +
    'or load meshcap first (docs/datapath.md, "Other programs at the cgroup root")';
}
