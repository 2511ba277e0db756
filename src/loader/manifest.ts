// What meshcap loads: objects, their programs and where each attaches.
import path from 'node:path';
import { bpfObjectDir } from '../paths.js';
import type { OptionalFeature } from './features.js';

export interface CgroupProgram {
  /** program (function) name in the object; also the link's pin name */
  name: string;
  /** addon consts.attachType key */
  attachType: string;
}

export interface ObjectSpec {
  file: string;
  cgroup: CgroupProgram[];
  /** A kernel that cannot load it loses this feature only (not eBPF mode). */
  optional?: boolean;
  /** `const volatile __u8` flags in its .rodata, set to 1 where the optional feature probes ok. */
  rodata?: Record<string, OptionalFeature>;
  /** `const volatile __u8` flags set to 1 where the named optional object, earlier in NODE_OBJECTS, was attached in the same load. */
  rodataAttached?: Record<string, string>;
}

/**
 * Attached once at the cgroup v2 root, in this order: an upgrade replaces
 * one program at a time, so every reader of an original destination is
 * replaced before the writer that may start leaving it somewhere new.
 * sockops comes before outbound: it reads one where either connect4 left it
 * (socket storage now, mc_sockorig before). getsockopt and getpeername come
 * before outbound too: the new connect4 names a destination by a slot
 * (mc_dstslot) that only the new readers know, so none of its connections
 * meets an older reader.
 */
export const NODE_OBJECTS: ObjectSpec[] = [
  { file: 'sockops.bpf.o', cgroup: [{ name: 'mc_sockops', attachType: 'CGROUP_SOCK_OPS' }] },
  {
    file: 'origdst.bpf.o',
    cgroup: [{ name: 'mc_getsockopt', attachType: 'CGROUP_GETSOCKOPT' }],
    rodata: { mc_set_retval: 'getsockoptRetval', mc_read_flowlabel: 'getsockoptProbeRead' },
  },
  {
    file: 'dns.bpf.o',
    cgroup: [
      { name: 'mc_sendmsg4', attachType: 'CGROUP_UDP4_SENDMSG' },
      { name: 'mc_sendmsg6', attachType: 'CGROUP_UDP6_SENDMSG' },
      { name: 'mc_recvmsg4', attachType: 'CGROUP_UDP4_RECVMSG' },
      { name: 'mc_recvmsg6', attachType: 'CGROUP_UDP6_RECVMSG' },
    ],
  },
  // The views as under iptables REDIRECT: the app's getpeername (the
  // original destination); for a slotted IPv4 connection the app's
  // getsockname and the proxy's peer (the pod's address). Optional: the hooks
  // are 5.8+; without them the app's view of its own socket's peer differs,
  // and connect4 binds the pod's address (mc_src_view 0).
  {
    file: 'peername.bpf.o',
    cgroup: [
      { name: 'mc_getpeername4', attachType: 'CGROUP_INET4_GETPEERNAME' },
      { name: 'mc_getpeername6', attachType: 'CGROUP_INET6_GETPEERNAME' },
      { name: 'mc_getsockname4', attachType: 'CGROUP_INET4_GETSOCKNAME' },
      { name: 'mc_getsockname6', attachType: 'CGROUP_INET6_GETSOCKNAME' },
    ],
    optional: true,
  },
  {
    file: 'outbound.bpf.o',
    cgroup: [
      { name: 'mc_connect4', attachType: 'CGROUP_INET4_CONNECT' },
      { name: 'mc_connect6', attachType: 'CGROUP_INET6_CONNECT' },
    ],
    rodataAttached: { mc_src_view: 'peername.bpf.o' },
  },
];

/**
 * Maps pinned by older meshcap versions for the sk_msg splice (removed in
 * issue 20: docs/datapath.md "Why there is no splice"). Nothing uses them any
 * more; load unpins them (removeLegacyPins) and uninstall sweeps them with the
 * rest. mc_splice held the mc_splice_msg verdict: unpinning it drops the
 * verdict from the map, and sockets still in it keep theirs until they close.
 */
export const LEGACY_MAPS = ['mc_splice', 'mc_splice_ref', 'mc_settings'] as const;

/** One instance per meshed pod, attached to its netns (sk_lookup); the agent loads them ahead (src/pod-datapath/inbound-pool.ts). */
export const POD_INBOUND_OBJECT = 'inbound.bpf.o';
export const POD_INBOUND_PROGRAM = 'mc_inbound';

/**
 * Inbound since issue 19: each datapath load verifies mc_inbound_main once and
 * puts it in slot 0 of the pinned prog array mc_inbound_tail; each pod gets a
 * stub (a few instructions: names its pod, tail-calls the slot). The program
 * is pinned at <pin root>/progs/mc_inbound_main. POD_INBOUND_OBJECT is what a
 * pod gets when this kernel refused the shared program (and what older
 * meshcap versions pinned per pod).
 */
export const INBOUND_SHARED_OBJECT = 'inbound-shared.bpf.o';
export const INBOUND_SHARED_PROGRAM = 'mc_inbound_main';
export const INBOUND_STUB_OBJECT = 'inbound-stub.bpf.o';
export const INBOUND_STUB_PROGRAM = 'mc_inbound_pod';
export const INBOUND_TAIL_MAP = 'mc_inbound_tail';

export const objectPath = (file: string, dir = bpfObjectDir) => path.join(dir, file);

/** Layout under the pin root. */
export const pinLayout = (root: string) => {
  const pods = path.join(root, 'pods');
  return {
    root,
    maps: path.join(root, 'maps'),
    links: path.join(root, 'links'),
    pods,
    progs: path.join(root, 'progs'),
    link: (name: string) => path.join(root, 'links', name),
    prog: (name: string) => path.join(root, 'progs', name),
    // Joined by hand: a cookie's digits need no normalizing, and a pass over
    // 10,000 pods made 8.5 MB of path.join garbage here (docs/bench-scale.md).
    podDir: (netns: bigint) => `${pods}/${netns}`,
    podInbound: (netns: bigint) => `${pods}/${netns}/inbound`,
  };
};
