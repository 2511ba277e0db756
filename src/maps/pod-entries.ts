// Pod capture config -> the exact map entries the datapath reads. Pure, so
// every decision is unit-testable; the registry writes the result. Encodes
// only: what eBPF mode cannot honour is decided before, by configLimit
// (src/decision/ebpf-limits.ts), and the eBPF backend never hands such a
// config here.
import type { CaptureConfig, Cidr } from '../redirect/config.js';
import { parseAddrBytes } from '../redirect/cidr.js';
import {
  CidrKind, MAP, MC_CIDR_KEY_BITS, MC_POD_ADDRS, MC_PORT_RANGES, PodFlag, PortKind,
  mcCidrKey, mcPod, mcPortKey, mcPortRange, mcPortRangeKey, mcStats, u64Key,
} from './layout.js';

export type MapName = (typeof MAP)[keyof typeof MAP];

export interface MapEntry {
  map: MapName;
  key: Buffer;
  value: Buffer;
}

export interface PodEntries {
  pod: MapEntry;
  stats: MapEntry;
  cidrs: MapEntry[];
  ports: MapEntry[];
  /** Wide port ranges (mc_portranges), instead of one mc_ports entry per port. */
  ranges: MapEntry[];
}

/** The pod's entries in the maps that hold a variable number per pod (written, swept and checked alike). */
export function keyedEntries(e: PodEntries): MapEntry[] {
  return [...e.cidrs, ...e.ports, ...e.ranges];
}

/** A run of consecutive ports this long or longer is stored as a range. */
export const RANGE_MIN = 16;

/**
 * A port list as the maps hold it: runs of RANGE_MIN or more consecutive
 * ports become ranges (the widest MC_PORT_RANGES of them), the rest single
 * ports. So `1024:65535` is one entry, not 64,512 in the node-wide table.
 */
export function splitPorts(list: readonly number[]): { singles: number[]; ranges: [number, number][] } {
  const sorted = [...new Set(list)].sort((a, b) => a - b);
  const runs: [number, number][] = [];
  for (const port of sorted) {
    const last = runs[runs.length - 1];
    if (last && port === last[1] + 1) last[1] = port;
    else runs.push([port, port]);
  }
  const wide = runs.filter(([lo, hi]) => hi - lo + 1 >= RANGE_MIN).sort((a, b) => (b[1] - b[0]) - (a[1] - a[0])).slice(0, MC_PORT_RANGES);
  const kept = new Set(wide);
  const singles: number[] = [];
  for (const r of runs) if (!kept.has(r)) for (let p = r[0]; p <= r[1]; p++) singles.push(p);
  return { singles, ranges: wide.sort((a, b) => a[0] - b[0]) };
}

const NO_ID = 0xffffffff; // matches no uid/gid

function addrBytes(ip: string): { family: 4 | 6; bytes: Buffer } {
  const parsed = parseAddrBytes(ip);
  if (!parsed) throw new Error(`pod address "${ip}" is not an IP address`);
  return parsed;
}

/** Where the netns cookie sits in the key of each map a pod has a variable number of entries in. */
export const NETNS_OFFSET: Readonly<Record<string, number>> = Object.fromEntries(
  ([[MAP.cidrs, mcCidrKey], [MAP.ports, mcPortKey], [MAP.portranges, mcPortRangeKey]] as const)
    .map(([m, layout]) => [m, layout.fields.find((f) => f.name === 'netns')!.offset]),
);

/**
 * What a config alone decides: its keyed entries (netns 0) and its flags.
 * Computed once per config object: a pass over 10,000 pods whose records
 * share a few configs (configOf returns one object per distinct settings)
 * then only writes each pod's netns into copies of the keys.
 */
interface ConfigTemplate {
  cidrs: MapEntry[];
  ports: MapEntry[];
  ranges: MapEntry[];
  flags: number;
  /** Each keyed entry's key as hex around its netns (diff compares hex keys). */
  hex: Map<MapName, KeyTemplate[]>;
  /** The mc_pods value without addresses (podValue copies it and writes the pod's). */
  podBase?: Buffer;
}
const templates = new WeakMap<CaptureConfig, ConfigTemplate>();

function templateOf(cfg: CaptureConfig): ConfigTemplate {
  const known = templates.get(cfg);
  if (known) return known;
  const p = cfg.parsed;
  const netns = 0n;
  let flags = 0;
  if (p.outboundIncludeAll) flags |= PodFlag.OUT_ALL4 | PodFlag.OUT_ALL6;
  if (p.inboundCapture) flags |= PodFlag.IN_CAPTURE;
  if (p.inboundIncludeAll) flags |= PodFlag.IN_ALL;
  if (p.dnsCapture !== 'off') flags |= PodFlag.DNS;
  if (p.dnsCapture === 'all') flags |= PodFlag.DNS_ALL;
  // IPv6 capture as iptables mode renders it (ip6tables rules only with
  // enableIPv6); the pod's v6 addresses are stored either way (own-pod checks).
  if (cfg.enableIPv6) flags |= PodFlag.IPV6;

  const ports: MapEntry[] = [];
  const ranges: MapEntry[] = [];
  const portSet = (list: number[], kind: number) => {
    const split = splitPorts(list);
    for (const port of split.singles) {
      ports.push({ map: MAP.ports, key: mcPortKey.encode({ netns, port, kind }), value: Buffer.from([1]) });
    }
    split.ranges.forEach(([lo, hi], idx) => {
      ranges.push({ map: MAP.portranges, key: mcPortRangeKey.encode({ netns, kind, idx }), value: mcPortRange.encode({ lo, hi }) });
    });
  };
  portSet(p.outboundExcludePorts, PortKind.OUT_EXCLUDE);
  portSet(p.outboundIncludePorts, PortKind.OUT_INCLUDE);
  if (p.inboundIncludeAll) portSet(p.inboundExcludePorts, PortKind.IN_EXCLUDE);
  else portSet(p.inboundIncludePorts, PortKind.IN_INCLUDE);
  // The programs look at mc_portranges only for pods that have some.
  if (ranges.length) flags |= PodFlag.PORT_RANGES;
  // connect4/6 skip the lookups of a kind the pod has no entries of (set
  // only for none, so an entry without these flags still gets every lookup).
  if (!p.outboundExcludePorts.length) flags |= PodFlag.NO_OUT_XPORTS;
  if (!p.outboundIncludePorts.length) flags |= PodFlag.NO_OUT_IPORTS;
  if (!p.outboundExcludeCidrs.v4.length && !p.outboundExcludeCidrs.v6.length) flags |= PodFlag.NO_OUT_XCIDRS;

  const cidrs: MapEntry[] = [];
  const cidr = (c: Cidr, kind4: number) => {
    const kind = c.family === 4 ? kind4 : kind4 + 2;
    cidrs.push({
      map: MAP.cidrs,
      key: mcCidrKey.encode({ prefixlen: MC_CIDR_KEY_BITS + c.prefix, kind, netns, addr: c.bytes }),
      value: Buffer.from([1]),
    });
  };
  for (const c of [...p.outboundExcludeCidrs.v4, ...p.outboundExcludeCidrs.v6]) cidr(c, CidrKind.OUT_EXCLUDE4);
  if (!p.outboundIncludeAll) {
    for (const c of [...p.outboundIncludeCidrs.v4, ...p.outboundIncludeCidrs.v6]) cidr(c, CidrKind.OUT_INCLUDE4);
  }
  if (p.dnsCapture === 'servers') {
    for (const s of [...p.dnsServersV4, ...p.dnsServersV6]) {
      const a = addrBytes(s);
      cidr({ family: a.family, address: s, prefix: a.family === 4 ? 32 : 128, bytes: a.bytes }, CidrKind.DNS4);
    }
  }
  const hex = new Map<MapName, { before: string; after: string; value: Buffer; key: Buffer }[]>();
  for (const x of [...cidrs, ...ports, ...ranges]) {
    const h = x.key.toString('hex');
    const at = NETNS_OFFSET[x.map]! * 2;
    const list = hex.get(x.map) ?? [];
    list.push({ before: h.slice(0, at), after: h.slice(at + 16), value: x.value, key: x.key });
    hex.set(x.map, list);
  }
  const t: ConfigTemplate = { cidrs, ports, ranges, flags, hex };
  templates.set(cfg, t);
  return t;
}

/** A keyed entry of a config, its key as hex around the netns cookie's 16 hex digits. */
export interface KeyTemplate {
  before: string;
  after: string;
  value: Buffer;
  /** the key with some other netns: keyWithNetns puts the pod's in */
  key: Buffer;
}

/** The config's keyed entries by map, as hex around the netns cookie: what diff compares with the kernel's. */
export function keyTemplates(cfg: CaptureConfig): ReadonlyMap<MapName, readonly KeyTemplate[]> {
  return templateOf(cfg).hex;
}

/** A template's key with the pod's netns cookie in it. */
export function keyWithNetns(template: Buffer, map: MapName, netns: bigint): Buffer {
  const key = Buffer.from(template);
  key.writeBigUInt64LE(netns, NETNS_OFFSET[map]!);
  return key;
}

const POD_OFF = Object.fromEntries(mcPod.fields.map((f) => [f.name, f.offset])) as Record<'n_addr4' | 'n_addr6' | 'addr4' | 'addr6', number>;

/**
 * The pod's mc_pods value: its config's part encoded once per config, the
 * pod's addresses written into a copy (a pass over 10,000 pods encoded the
 * whole struct, and formatted each address back to text, per pod).
 */
export function podValue(cfg: CaptureConfig, podIPs: string[]): Buffer {
  const t = templateOf(cfg);
  const p = cfg.parsed;
  t.podBase ??= mcPod.encode({
    outbound_port: p.proxyPort,
    inbound_port: p.inboundCapturePort,
    tunnel_port: p.inboundTunnelPort,
    dns_port: p.dnsPort,
    proxy_uid: p.proxyUids[0] ?? NO_ID,
    proxy_gid: p.proxyGids[0] ?? NO_ID,
    flags: t.flags,
    n_addr4: 0,
    n_addr6: 0,
    addr4: Buffer.alloc(0),
    addr6: Buffer.alloc(0),
  });
  const b = Buffer.from(t.podBase);
  let n4 = 0;
  let n6 = 0;
  for (const ip of podIPs) {
    const a = addrBytes(ip);
    const n = a.family === 4 ? n4++ : n6++;
    // (configLimit refuses such a pod first; this keeps the codec's own check)
    if (n >= MC_POD_ADDRS) throw new RangeError(`mc_pod.addr${a.family}: more than ${MC_POD_ADDRS} IPv${a.family} addresses do not fit`);
    a.bytes.copy(b, a.family === 4 ? POD_OFF.addr4 + 4 * n : POD_OFF.addr6 + 16 * n);
  }
  b[POD_OFF.n_addr4] = n4;
  b[POD_OFF.n_addr6] = n6;
  return b;
}

const ZERO_STATS = mcStats.encode({ outbound: 0n, own_pod: 0n, inbound: 0n, dns: 0n, origdst: 0n });

export function podEntries(netns: bigint, cfg: CaptureConfig, podIPs: string[]): PodEntries {
  const t = templateOf(cfg);
  const key = u64Key(netns);
  const pod: MapEntry = { map: MAP.pods, key, value: podValue(cfg, podIPs) };
  const stats: MapEntry = { map: MAP.stats, key, value: Buffer.from(ZERO_STATS) };
  const own = (list: MapEntry[]) => list.map((x) => ({ map: x.map, key: keyWithNetns(x.key, x.map, netns), value: Buffer.from(x.value) }));
  return { pod, stats, cidrs: own(t.cidrs), ports: own(t.ports), ranges: own(t.ranges) };
}

/** The netns a cidrs/ports key belongs to (for sweeping a pod's entries). */
export function netnsOfKey(map: MapName, key: Buffer): bigint | null {
  if (map === MAP.cidrs) return mcCidrKey.decode(key).netns;
  if (map === MAP.ports) return mcPortKey.decode(key).netns;
  if (map === MAP.portranges) return mcPortRangeKey.decode(key).netns;
  if (map === MAP.pods || map === MAP.stats) return key.readBigUInt64LE(0);
  return null;
}

