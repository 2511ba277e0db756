// What meshcap loads: objects, their programs and where each attaches.
import path from 'node:path';
import { bpfObjectDir } from '../paths.js';

export interface CgroupProgram {
  /** program (function) name in the object; also the link's pin name */
  name: string;
  /** addon consts.attachType key */
  attachType: string;
}

/** A program the kernel attaches to a map (no bpf_link: the map holds it). */
export interface MapProgram {
  name: string;
  /** map pin name under <pin root>/maps */
  map: string;
  attachType: string;
}

export interface ObjectSpec {
  file: string;
  cgroup: CgroupProgram[];
  maps?: MapProgram[];
  /** A kernel that cannot load it loses this feature only (not eBPF mode). */
  optional?: boolean;
}

/** Attached once at the cgroup v2 root. */
export const NODE_OBJECTS: ObjectSpec[] = [
  {
    file: 'outbound.bpf.o',
    cgroup: [
      { name: 'mc_connect4', attachType: 'CGROUP_INET4_CONNECT' },
      { name: 'mc_connect6', attachType: 'CGROUP_INET6_CONNECT' },
    ],
  },
  // The splice's verdict: sockets take the map's programs when they are
  // inserted, so it is attached before sockops can insert any. Optional: it
  // reads the peer socket's TCP state (issue 20), which older kernels may refuse.
  { file: 'splice.bpf.o', cgroup: [], maps: [{ name: 'mc_splice_msg', map: 'mc_splice', attachType: 'SK_MSG_VERDICT' }], optional: true },
  { file: 'sockops.bpf.o', cgroup: [{ name: 'mc_sockops', attachType: 'CGROUP_SOCK_OPS' }] },
  { file: 'origdst.bpf.o', cgroup: [{ name: 'mc_getsockopt', attachType: 'CGROUP_GETSOCKOPT' }] },
  {
    file: 'dns.bpf.o',
    cgroup: [
      { name: 'mc_sendmsg4', attachType: 'CGROUP_UDP4_SENDMSG' },
      { name: 'mc_sendmsg6', attachType: 'CGROUP_UDP6_SENDMSG' },
      { name: 'mc_recvmsg4', attachType: 'CGROUP_UDP4_RECVMSG' },
      { name: 'mc_recvmsg6', attachType: 'CGROUP_UDP6_RECVMSG' },
    ],
  },
  // The app's getpeername as under iptables REDIRECT (the original
  // destination). Optional: the hooks are 5.8+, and without them only the
  // app's view of its own socket's peer differs.
  {
    file: 'peername.bpf.o',
    cgroup: [
      { name: 'mc_getpeername4', attachType: 'CGROUP_INET4_GETPEERNAME' },
      { name: 'mc_getpeername6', attachType: 'CGROUP_INET6_GETPEERNAME' },
    ],
    optional: true,
  },
];

/** Loaded once per meshed pod and attached to its netns (sk_lookup). */
export const POD_INBOUND_OBJECT = 'inbound.bpf.o';
export const POD_INBOUND_PROGRAM = 'mc_inbound';
export const POD_INBOUND_RODATA = 'mc_netns';

export const objectPath = (file: string, dir = bpfObjectDir) => path.join(dir, file);

/** Layout under the pin root. */
export const pinLayout = (root: string) => ({
  root,
  maps: path.join(root, 'maps'),
  links: path.join(root, 'links'),
  pods: path.join(root, 'pods'),
  link: (name: string) => path.join(root, 'links', name),
  podDir: (netns: bigint) => path.join(root, 'pods', netns.toString()),
  podInbound: (netns: bigint) => path.join(root, 'pods', netns.toString(), 'inbound'),
});
