// Pod capture config -> the exact map entries the datapath reads. Pure, so
// every decision is unit-testable; the registry writes the result.
import type { CaptureConfig, Cidr } from '../redirect/config.js';
import { cidrToString, parseAddr } from '../redirect/cidr.js';
import { ISTIO_ANNOTATIONS } from '../mesh/vocabulary.js';
import {
  CidrKind, MAP, MC_CIDR_KEY_BITS, MC_POD_ADDRS, PodFlag, PortKind,
  mcCidrKey, mcPod, mcPortKey, mcStats, u64Key,
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
}

/** A setting the eBPF datapath cannot honour: the pod must not be silently half-captured. */
export class UnsupportedInEbpfError extends Error {
  constructor(readonly setting: string, detail: string) {
    super(`${setting}: ${detail} is not supported in eBPF mode (use iptables mode for this pod or node)`);
    this.name = 'UnsupportedInEbpfError';
  }
}

const NO_ID = 0xffffffff; // matches no uid/gid

function addrBytes(ip: string): { family: 4 | 6; bytes: Buffer } {
  const parsed = parseAddr(ip);
  if (!parsed) throw new Error(`pod address "${ip}" is not an IP address`);
  return parsed;
}

export function podEntries(netns: bigint, cfg: CaptureConfig, podIPs: string[]): PodEntries {
  const p = cfg.parsed;
  if (p.proxyUids.length > 1) throw new UnsupportedInEbpfError('proxy uid', `more than one uid (${p.proxyUids.join(',')})`);
  if (p.proxyGids.length > 1) throw new UnsupportedInEbpfError('proxy gid', `more than one gid (${p.proxyGids.join(',')})`);
  if (!(p.ownerGroups.except && p.ownerGroups.values.length === 0)) {
    throw new UnsupportedInEbpfError('ISTIO_OUTBOUND_OWNER_GROUPS(_EXCLUDE)', 'an owner-group filter');
  }
  if (p.excludeInterfaces.length || p.kubeVirtInterfaces.length) {
    throw new UnsupportedInEbpfError(`${ISTIO_ANNOTATIONS.excludeInterfaces} / kubevirtInterfaces`, 'per-interface rules');
  }
  // Envoy's TPROXY inbound reaches the app from the client's address with
  // mark 1337, which Istio's mangle/mark rules let through; the connect hook
  // sees only the proxy uid and a connect to the pod's own address, and would
  // send it back to 15006.
  if (p.tproxy) throw new UnsupportedInEbpfError('interception mode', 'TPROXY (original-source upstream with socket mark)');
  // Istio drops its `-o lo` RETURN when an include range covers loopback; the
  // programs always leave loopback alone.
  if (p.outboundIncludesLoopback) throw new UnsupportedInEbpfError('includeOutboundIPRanges', 'a range covering loopback');
  // The programs hard-code Istio's default 127.0.0.1/32.
  if (cidrToString(p.hostIPv4Loopback) !== '127.0.0.1/32') {
    throw new UnsupportedInEbpfError('ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR', `${cidrToString(p.hostIPv4Loopback)} (only 127.0.0.1/32)`);
  }

  const v4 = podIPs.map(addrBytes).filter((a) => a.family === 4);
  const v6 = podIPs.map(addrBytes).filter((a) => a.family === 6);
  if (v4.length > MC_POD_ADDRS || v6.length > MC_POD_ADDRS) {
    throw new UnsupportedInEbpfError('pod addresses', `more than ${MC_POD_ADDRS} addresses per family`);
  }
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

  const ports: MapEntry[] = [];
  const portSet = (list: number[], kind: number) => {
    for (const port of new Set(list)) {
      ports.push({ map: MAP.ports, key: mcPortKey.encode({ netns, port, kind }), value: Buffer.from([1]) });
    }
  };
  portSet(p.outboundExcludePorts, PortKind.OUT_EXCLUDE);
  portSet(p.outboundIncludePorts, PortKind.OUT_INCLUDE);
  if (p.inboundIncludeAll) portSet(p.inboundExcludePorts, PortKind.IN_EXCLUDE);
  else portSet(p.inboundIncludePorts, PortKind.IN_INCLUDE);

  const stats: MapEntry = {
    map: MAP.stats,
    key,
    value: mcStats.encode({ outbound: 0n, own_pod: 0n, inbound: 0n, dns: 0n, origdst: 0n }),
  };
  return { pod, stats, cidrs, ports };
}

/** The netns a cidrs/ports key belongs to (for sweeping a pod's entries). */
export function netnsOfKey(map: MapName, key: Buffer): bigint | null {
  if (map === MAP.cidrs) return mcCidrKey.decode(key).netns;
  if (map === MAP.ports) return mcPortKey.decode(key).netns;
  if (map === MAP.pods || map === MAP.stats) return key.readBigUInt64LE(0);
  return null;
}

