// The kernel features eBPF mode needs, each with the kernel release that
// introduced it and how it is probed. Probes ask the kernel (trial loads and
// attaches through the addon), never the version string: distributions
// backport, and a version says nothing about a hook that is compiled out.

export type FeatureKind = 'prog' | 'map' | 'attach' | 'helper' | 'sockopt' | 'objects';

export interface FeatureSpec {
  name: string;
  kind: FeatureKind;
  /** upstream kernel release that introduced it */
  since: string;
  /** what meshcap uses it for */
  why: string;
  /** prog/map/attach type names (addon consts keys), helper name */
  progType?: string;
  mapType?: string;
  attachType?: string;
  helper?: string;
  target?: 'cgroup' | 'netns';
}

export interface FeatureResult {
  ok: boolean;
  since: string;
  why: string;
  detail?: string;
  /** The kernel has it but refused this process (EPERM/EACCES): a capability is missing, not a kernel feature. */
  denied?: boolean;
}

const prog = (progType: string, since: string, why: string): FeatureSpec =>
  ({ name: `prog_type.${progType.toLowerCase()}`, kind: 'prog', progType, since, why });
const map = (mapType: string, since: string, why: string): FeatureSpec =>
  ({ name: `map_type.${mapType.toLowerCase()}`, kind: 'map', mapType, since, why });
const attach = (progType: string, attachType: string, target: 'cgroup' | 'netns', since: string, why: string): FeatureSpec =>
  ({ name: `link.${attachType.toLowerCase()}`, kind: 'attach', progType, attachType, target, since, why });
const helper = (progType: string, h: string, since: string, why: string): FeatureSpec =>
  ({ name: `helper.${progType.toLowerCase()}.${h}`, kind: 'helper', progType, helper: h, since, why });

/** Everything eBPF mode needs. Missing any one of them means iptables mode. */
export const REQUIRED_FEATURES: FeatureSpec[] = [
  prog('CGROUP_SOCK_ADDR', '4.17', 'connect4/connect6 outbound capture, sendmsg/recvmsg DNS capture'),
  prog('SOCK_OPS', '4.13', 'hand the original destination from the app socket to the proxy socket'),
  prog('CGROUP_SOCKOPT', '5.3', 'answer getsockopt(SO_ORIGINAL_DST) for the proxy'),
  prog('SK_LOOKUP', '5.9', 'inbound capture to the proxy\'s inbound listener'),
  map('LPM_TRIE', '4.11', 'include/exclude CIDRs per pod'),
  map('LRU_HASH', '4.10', 'in-flight original destinations, bounded'),
  map('SK_STORAGE', '5.2', 'original destination owned by the proxy\'s socket'),
  map('SOCKHASH', '4.18', 'proxy inbound listeners (mc_listen)'),
  attach('CGROUP_SOCK_ADDR', 'CGROUP_INET4_CONNECT', 'cgroup', '5.7', 'bpf_link at the cgroup v2 root (pinned links survive the agent)'),
  attach('CGROUP_SOCK_ADDR', 'CGROUP_INET6_CONNECT', 'cgroup', '5.7', 'IPv6 and IPv4-mapped outbound capture'),
  attach('CGROUP_SOCK_ADDR', 'CGROUP_UDP4_SENDMSG', 'cgroup', '5.7', 'DNS capture (UDP)'),
  attach('CGROUP_SOCK_ADDR', 'CGROUP_UDP4_RECVMSG', 'cgroup', '5.7', 'DNS reply source restore'),
  attach('CGROUP_SOCKOPT', 'CGROUP_GETSOCKOPT', 'cgroup', '5.7', 'SO_ORIGINAL_DST'),
  attach('SOCK_OPS', 'CGROUP_SOCK_OPS', 'cgroup', '5.7', 'original destination handoff'),
  attach('SK_LOOKUP', 'SK_LOOKUP', 'netns', '5.9', 'per-pod inbound capture'),
  helper('CGROUP_SOCK_ADDR', 'get_netns_cookie', '5.7', 'pod identity at connect'),
  helper('SOCK_OPS', 'get_netns_cookie', '5.15', 'pod identity in sockops'),
  helper('CGROUP_SOCKOPT', 'get_netns_cookie', '5.15', 'pod identity at getsockopt'),
  helper('SOCK_OPS', 'sk_storage_get', '5.3', 'store the original destination on the proxy socket'),
  helper('SK_LOOKUP', 'sk_assign', '5.9', 'steer inbound connections'),
  { name: 'sockopt.so_netns_cookie', kind: 'sockopt', since: '5.14', why: 'the agent computes a pod\'s netns cookie from CNI_NETNS' },
  { name: 'objects.verified', kind: 'objects', since: '5.15', why: 'every meshcap BPF object passes this kernel\'s verifier (trial load)' },
];

/**
 * Optional features: each switches one behaviour of a program on (a `.rodata`
 * flag the loader sets from the probe, see ObjectSpec.rodata); without it the
 * program behaves as on older kernels. They never decide the mode.
 */
export const OPTIONAL_FEATURES = {
  /** the .rodata flag origdst.bpf.c reads (mc_set_retval) */
  getsockoptRetval: helper('CGROUP_SOCKOPT', 'set_retval', '5.18',
    'SO_ORIGINAL_DST on a socket without an original destination answers ENOENT (EINVAL for a short buffer) as conntrack does, also without nf_conntrack; before it a program-set error becomes EFAULT, so the kernel\'s own answer stands'),
  /** mc_read_flowlabel */
  getsockoptProbeRead: helper('CGROUP_SOCKOPT', 'probe_read_kernel', '5.8',
    'IP6T_SO_ORIGINAL_DST\'s sin6_flowinfo is the proxy socket\'s flow label, as ipv6_getorigdst() answers; without it (or under lockdown) 0'),
} satisfies Record<string, FeatureSpec>;
export type OptionalFeature = keyof typeof OPTIONAL_FEATURES;

/** eBPF mode is never chosen below this release, whatever the probes say. */
export const MIN_EBPF_KERNEL = { major: 4, minor: 19 };
