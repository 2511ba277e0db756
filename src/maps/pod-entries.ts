// Pod capture config -> the exact map entries the datapath reads. Pure, so
// every decision is unit-testable; the registry writes the result. Encodes
// only: what eBPF mode cannot honour is decided before, by configLimit
// (src/decision/ebpf-limits.ts), and the eBPF backend never hands such a
// config here.
import type { CaptureConfig, Cidr } from '../redirect/config.js';
import { parseAddr } from '../redirect/cidr.js';
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
  const parsed = parseAddr(ip);
  if (!parsed) throw new Error(`pod address "${ip}" is not an IP address`);
  return parsed;
}

export function podEntries(netns: bigint, cfg: CaptureConfig, podIPs: string[]): PodEntries {
  const p = cfg.parsed;
  const v4 = podIPs.map(addrBytes).filter((a) => a.family === 4);
  const v6 = podIPs.map(addrBytes).filter((a) => a.family === 6);
  const addr4 = Buffer.alloc(4 * MC_POD_ADDRS);
  v4.forEach((a, i) => a.bytes.copy(addr4, i * 4));
  const addr6 = Buffer.alloc(16 * MC_POD_ADDRS);
  v6.forEach((a, i) => a.bytes.copy(addr6, i * 16));

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

  const key = u64Key(netns);
  const pod: MapEntry = {
    map: MAP.pods,
    key,
    value: mcPod.encode({
      outbound_port: p.proxyPort,
      inbound_port: p.inboundCapturePort,
      tunnel_port: p.inboundTunnelPort,
      dns_port: p.dnsPort,
      proxy_uid: p.proxyUids[0] ?? NO_ID,
      proxy_gid: p.proxyGids[0] ?? NO_ID,
      flags,
      n_addr4: v4.length,
      n_addr6: v6.length,
      addr4,
      addr6,
    }),
  };

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


  const stats: MapEntry = {
    map: MAP.stats,
    key,
    value: mcStats.encode({ outbound: 0n, own_pod: 0n, inbound: 0n, dns: 0n, origdst: 0n }),
  };
  return { pod, stats, cidrs, ports, ranges };
}

/** The netns a cidrs/ports key belongs to (for sweeping a pod's entries). */
export function netnsOfKey(map: MapName, key: Buffer): bigint | null {
  if (map === MAP.cidrs) return mcCidrKey.decode(key).netns;
  if (map === MAP.ports) return mcPortKey.decode(key).netns;
  if (map === MAP.portranges) return mcPortRangeKey.decode(key).netns;
  if (map === MAP.pods || map === MAP.stats) return key.readBigUInt64LE(0);
  return null;
}

