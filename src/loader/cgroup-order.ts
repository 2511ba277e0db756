// Other programs on the same cgroup hooks as meshcap's, in the order the
// kernel runs them. Multi-attached cgroup programs run in attach order, and
// a socket load balancer on connect4/6 (Cilium's, with socketLB at the host
// root) that runs before meshcap rewrites a service address to a backend
// first: the sidecar then sees the backend as the original destination,
// where Istio's iptables (which run after the app's connect()) see the
// service. meshcap cannot reorder another owner's links, so it says so.
import * as bpf from '../native/addon.js';

export interface AttachedProgram {
  id: number;
  /** the hook, named as bpftool names it, e.g. cgroup_inet4_connect */
  attachType: string;
  name: string;
}

/** The hooks where the order decides what the sidecar sees (bpftool's name -> the addon's attach type). */
const HOOKS = { cgroup_inet4_connect: 'CGROUP_INET4_CONNECT', cgroup_inet6_connect: 'CGROUP_INET6_CONNECT' } as const;
export const ORDER_SENSITIVE = Object.keys(HOOKS) as (keyof typeof HOOKS)[];

/** Programs attached directly to `cgroup` on the order-sensitive hooks, each hook in the order it runs (BPF_PROG_QUERY through the addon). */
export function cgroupPrograms(cgroup: string): AttachedProgram[] {
  return ORDER_SENSITIVE.flatMap((hook) => bpf.cgroupPrograms(cgroup, bpf.consts.attachType[HOOKS[hook]]!).map((p) => ({ ...p, attachType: hook })));
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
