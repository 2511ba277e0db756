// What the eBPF datapath in the kernel does with one new connection of a pod,
// read from the pod's entries in the pinned maps and decided the way the BPF
// programs decide it (mc_decide in bpf/outbound.bpf.c for outbound,
// mc_inbound in bpf/inbound.bpf.c for inbound), step for step, so
// `meshcap explain` can put the kernel's answer beside the rules' answer: a
// pod whose maps differ from its record, or a program/explain disagreement,
// shows up as two different verdicts instead of a confident wrong one.
import { existsSync } from 'node:fs';
import path from 'node:path';
import * as bpf from '../native/addon.js';
import { pinLayout } from '../loader/manifest.js';
import {
  CidrKind, MAP, MAPS_ADDED_LATER, MC_CIDR_KEY_BITS, MC_LISTEN_SLOTS, MC_PORT_RANGES, PodFlag, PortKind,
  mcCidrKey, mcListenKey, mcPod, mcPortKey, mcPortRange, mcPortRangeKey, mcSlot, mcSlot6, mcSlotKey, mcV6Spill, u64Key,
  type McPod, type McSlot, type McSlot6, type McV6Spill,
} from '../maps/layout.js';
import { formatIPv6, parseAddr } from '../redirect/cidr.js';
import type { Flow } from './explain.js';

export interface KernelVerdict {
  verdict: 'captured' | 'not captured' | 'refused';
  /** Where connect() is sent (outbound) / the proxy port the socket is assigned to (inbound). */
  to?: string;
  /** The step of the program that decided, with the map entry it read. */
  decidedBy: string;
}

/** The lookups the programs make, against some pod's maps. */
export interface PodMapReader {
  pod(netns: bigint): McPod | null;
  /** As mc_port_in: mc_ports, then (pods flagged PORT_RANGES only) mc_portranges. */
  portIn(pod: McPod, netns: bigint, port: number, kind: number): boolean;
  /** LPM lookup of one address (4 or 16 bytes) in the CIDR kind (v4 kind; +2 for v6). */
  cidrMatch(netns: bigint, addr: Buffer, kind4: number): boolean;
  hasListener(netns: bigint, port: number, family: 4 | 6): boolean;
  /** The pod's destination slot (low 24 bits of 127.x.y.z), null when free. */
  slot(netns: bigint, slot: number): McSlot | null;
  /** The pod's IPv6 destination slot (last 32 bits of 100::S), null when free or none. */
  slot6?(netns: bigint, slot: number): McSlot6 | null;
  /** The pod's mc_v6spill entry: null when its IPv6 connections all go to [::1]. */
  v6Spill?(netns: bigint): McV6Spill | null;
}

const DNS_PORT = 53;

/** The pinned maps of a loaded datapath, opened read-only for lookups. */
export class PinnedPodMaps implements PodMapReader {
  private readonly fds = new Map<string, number>();

  constructor(pinRoot: string) {
    const dir = pinLayout(pinRoot).maps;
    try {
      for (const name of [MAP.pods, MAP.ports, MAP.portranges, MAP.cidrs, MAP.listen, MAP.dstslot, MAP.dstslot6, MAP.v6spill]) {
        // an older datapath: no ranges, no slots
        if (MAPS_ADDED_LATER.has(name) && !existsSync(path.join(dir, name))) continue;
        this.fds.set(name, bpf.objGet(path.join(dir, name)));
      }
    } catch (e) {
      this.close();
      throw new Error(`cannot open meshcap's pinned maps under ${dir}: ${(e as Error).message}. Is the eBPF datapath loaded (meshcap load)?`);
    }
  }

  close(): void {
    for (const fd of this.fds.values()) bpf.closeFd(fd);
    this.fds.clear();
  }

  private fd(name: string): number {
    return this.fds.get(name)!;
  }

  pod(netns: bigint): McPod | null {
    const v = bpf.mapLookup(this.fd(MAP.pods), u64Key(netns), mcPod.size);
    return v ? mcPod.decode(v) : null;
  }

  portIn(pod: McPod, netns: bigint, port: number, kind: number): boolean {
    if (bpf.mapLookup(this.fd(MAP.ports), mcPortKey.encode({ netns, port, kind, pad: Buffer.alloc(5) }), 1) !== null) return true;
    if (!(pod.flags & PodFlag.PORT_RANGES) || !this.fds.has(MAP.portranges)) return false;
    // as mc_port_in: ranges idx 0.. until the first missing one
    for (let idx = 0; idx < MC_PORT_RANGES; idx++) {
      const v = bpf.mapLookup(this.fd(MAP.portranges), mcPortRangeKey.encode({ netns, kind, idx }), mcPortRange.size);
      if (!v) return false;
      const r = mcPortRange.decode(v);
      if (port >= r.lo && port <= r.hi) return true;
    }
    return false;
  }

  cidrMatch(netns: bigint, addr: Buffer, kind4: number): boolean {
    const v4 = addr.length === 4;
    const a = Buffer.alloc(16);
    addr.copy(a);
    const key = mcCidrKey.encode({ prefixlen: MC_CIDR_KEY_BITS + (v4 ? 32 : 128), kind: v4 ? kind4 : kind4 + 2, pad: Buffer.alloc(3), netns, addr: a });
    return bpf.mapLookup(this.fd(MAP.cidrs), key, 1) !== null;
  }

  hasListener(netns: bigint, port: number, family: 4 | 6): boolean {
    for (let slot = 0; slot < MC_LISTEN_SLOTS; slot++) {
      if (bpf.mapLookup(this.fd(MAP.listen), mcListenKey.encode({ netns, port, family, slot, pad: Buffer.alloc(4) }), 8) !== null) return true;
    }
    return false;
  }

  slot(netns: bigint, slot: number): McSlot | null {
    if (!this.fds.has(MAP.dstslot)) return null;
    const v = bpf.mapLookup(this.fd(MAP.dstslot), mcSlotKey.encode({ netns, slot, pad: 0 }), mcSlot.size);
    return v ? mcSlot.decode(v) : null;
  }

  slot6(netns: bigint, slot: number): McSlot6 | null {
    if (!this.fds.has(MAP.dstslot6)) return null;
    const v = bpf.mapLookup(this.fd(MAP.dstslot6), mcSlotKey.encode({ netns, slot, pad: 0 }), mcSlot6.size);
    return v ? mcSlot6.decode(v) : null;
  }

  v6Spill(netns: bigint): McV6Spill | null {
    if (!this.fds.has(MAP.v6spill)) return null;
    const v = bpf.mapLookup(this.fd(MAP.v6spill), u64Key(netns), mcV6Spill.size);
    return v ? mcV6Spill.decode(v) : null;
  }
}

/**
 * The candidate slots of an IPv4 destination, in probe order, as
 * mc_slot_hash4 and mc_slot_of4 in bpf/ compute them (probe 0 is also the
 * address the version before slots picked); reserved ones (127.0.0.0,
 * 127.0.0.1, 127.0.0.6, 127.255.255.255) are skipped, as the programs skip
 * them.
 */
export const MC_SLOT_PROBES = 4;
/** mc_slot_mix in bpf/outbound.bpf.c: the probe's mix of a destination's hash input (both families). */
function slotMix(x: number, probe: number): number {
  x = (x + Math.imul(probe, 0x632be5ab)) >>> 0;
  x = Math.imul(x, 0x9e3779b1) >>> 0;
  x = (x ^ (x >>> 15)) >>> 0;
  x = Math.imul(x, 0x85ebca77) >>> 0;
  return (x ^ (x >>> 13)) >>> 0;
}

export function slotCandidates4(addr: Buffer, port: number): number[] {
  const out: number[] = [];
  for (let probe = 0; probe < MC_SLOT_PROBES; probe++) {
    const x = slotMix((addr.readUInt32BE(0) ^ ((port << 16) | port)) >>> 0, probe) & 0xffffff;
    if (x === 0 || x === 1 || x === 6 || x === 0xffffff) continue;
    out.push(x);
  }
  return out;
}

export const slotAddress = (slot: number): string => `127.${slot >>> 16}.${(slot >>> 8) & 255}.${slot & 255}`;

/**
 * The loopback address connect4 sends an IPv4 destination to when the
 * proxy's outbound listener takes the wildcard address, for a pod whose
 * slots are all free: the first candidate (bpf/outbound.bpf.c
 * mc_loopback_for4). One per destination and port, so each gets its own
 * ephemeral port range (docs/bench-capacity.md); the address names the
 * destination (mc_dstslot). A proxy bound to 127.0.0.1 only gets 127.0.0.1.
 */
export function spreadLoopback4(addr: Buffer, port: number): string {
  const first = slotCandidates4(addr, port)[0];
  return first === undefined ? '127.0.0.1' : slotAddress(first);
}

/**
 * Where the pod's next connect to this destination goes, from its slots:
 * the slot that names it, else the first free candidate (the connect claims
 * it), else 127.0.0.1 (every candidate names another destination).
 */
export function slotFor4(maps: PodMapReader, netns: bigint, addr: Buffer, port: number, to: number): SlotChoice {
  return pickSlot(slotCandidates4(addr, port), (c) => maps.slot(netns, c), { addr, port, to }, slotAddress, '127.0.0.1');
}

type SlotChoice = { address: string; slot: 'has' | 'free' | 'none' };

/** As mc_slot_claim4/6 choose: the candidate that names the destination, else the first free one, else none (`fallback`). */
function pickSlot(candidates: number[], read: (slot: number) => { addr: Buffer; port: number; to: number } | null,
  want: { addr: Buffer; port: number; to: number }, address: (slot: number) => string, fallback: string): SlotChoice {
  let free: number | undefined;
  for (const c of candidates) {
    const v = read(c);
    if (!v) {
      free ??= c;
      continue;
    }
    if (v.addr.equals(want.addr) && v.port === want.port && v.to === want.to) return { address: address(c), slot: 'has' };
  }
  return free === undefined ? { address: fallback, slot: 'none' } : { address: address(free), slot: 'free' };
}

/**
 * The candidate slots of an IPv6 destination, in probe order, as
 * mc_slot_hash6 in bpf/outbound.bpf.c computes them (never 0).
 */
export function slotCandidates6(addr: Buffer, port: number): number[] {
  const w = [0, 1, 2, 3].map((i) => addr.readUInt32BE(i * 4));
  const out: number[] = [];
  for (let probe = 0; probe < MC_SLOT_PROBES; probe++) {
    const x = slotMix((w[0]! ^ Math.imul(w[1]!, 0x85ebca77) ^ Math.imul(w[2]!, 0xc2b2ae35) ^ w[3]! ^ ((port << 16) | port)) >>> 0, probe);
    out.push(x || 1);
  }
  return out;
}

/** The address 100::S of IPv6 slot S, as text. */
export function slotAddress6(slot: number): string {
  const b = Buffer.alloc(16);
  b.writeUInt32BE(0x01000000, 0);
  b.writeUInt32BE(slot >>> 0, 12);
  return formatIPv6(b);
}

/** slotFor4 for IPv6: the slot that names the destination, else the first free candidate, else none. */
export function slotFor6(maps: PodMapReader, netns: bigint, addr: Buffer, port: number, to: number): SlotChoice {
  return pickSlot(slotCandidates6(addr, port), (c) => maps.slot6?.(netns, c) ?? null, { addr, port, to }, slotAddress6, '::1');
}

function isLoopback(a: { family: 4 | 6; bytes: Buffer }): boolean {
  if (a.bytes.every((b) => b === 0)) return true; // 0.0.0.0 / :: reach this host over loopback
  return a.family === 4 ? a.bytes[0] === 127 : a.bytes.subarray(0, 15).every((b) => b === 0) && a.bytes[15] === 1;
}

function isHostLoopback(a: { family: 4 | 6; bytes: Buffer }): boolean {
  if (a.bytes.every((b) => b === 0)) return true;
  return a.family === 4 ? a.bytes.equals(Buffer.from([127, 0, 0, 1])) : a.bytes.subarray(0, 15).every((b) => b === 0) && a.bytes[15] === 1;
}

function isPodAddr(pod: McPod, a: { family: 4 | 6; bytes: Buffer }): boolean {
  const n = a.family === 4 ? pod.n_addr4 : pod.n_addr6;
  const all = a.family === 4 ? pod.addr4 : pod.addr6;
  const w = a.family === 4 ? 4 : 16;
  for (let i = 0; i < n; i++) if (all.subarray(i * w, i * w + w).equals(a.bytes)) return true;
  return false;
}

/**
 * The kernel's verdict for `flow` in the pod with netns cookie `netns`.
 * Outbound assumes the connecting socket's source is not yet bound to
 * 127.0.0.6 (the proxy's inbound passthrough binds it; a plain client does not).
 */
export function kernelVerdict(maps: PodMapReader, netns: bigint, flow: Flow): KernelVerdict {
  const pod = maps.pod(netns);
  if (!pod) return { verdict: 'not captured', decidedBy: `no mc_pods entry for netns cookie ${netns}: the programs leave every connection of this netns alone` };
  const dst = parseAddr(flow.peer);
  if (!dst) throw new Error(`${flow.peer} is not an IP address`);
  const kind = (k: string) => `${k} entry for netns cookie ${netns}`;
  if (flow.direction === 'inbound') return inboundVerdict(maps, netns, pod, dst, flow, kind);

  const loop = dst.family === 4 ? '127.0.0.1' : '::1';
  const to = (port: number) => `${dst.family === 6 ? `[${loop}]` : loop}:${port}`;
  // IPv4 to the outbound port: the destination's own 127/8 address where the proxy listens on 0.0.0.0
  const out = (why: string): KernelVerdict => {
    if (dst.family === 6) {
      const sp = maps.v6Spill?.(netns) ?? null;
      if (!sp) return { verdict: 'captured', to: to(pod.outbound_port), decidedBy: `${why}; IPv6: [::1] (no ${MAP.v6spill} entry: this pod takes no IPv6 slots)` };
      const s = slotFor6(maps, netns, dst.bytes, flow.port, pod.outbound_port);
      const past = sp.open >= sp.at;
      const slot = s.slot === 'has' ? `its slot [${s.address}] in ${MAP.dstslot6}` : s.slot === 'free' ? `a free slot [${s.address}] the connect claims in ${MAP.dstslot6}` : 'no slot (every candidate names another destination)';
      return {
        verdict: 'captured', to: past && s.slot !== 'none' ? `[${s.address}]:${pod.outbound_port}` : to(pod.outbound_port),
        decidedBy: `${why}; IPv6: [::1] while the pod has fewer than ${sp.at} redirected IPv6 connections open there (${MAP.v6spill}: ${sp.open} now), then ${slot} if a listener on [::]:${pod.outbound_port} takes it`,
      };
    }
    const s = slotFor4(maps, netns, dst.bytes, flow.port, pod.outbound_port);
    const slot = s.slot === 'has' ? `the pod's slot for ${flow.peer}:${flow.port} in ${MAP.dstslot}` :
      s.slot === 'free' ? `a free slot the first connect claims in ${MAP.dstslot}` : `no slot (every candidate names another destination; the socket's storage carries it)`;
    return {
      verdict: 'captured', to: `${s.address}:${pod.outbound_port}`,
      decidedBy: `${why}; sent to this destination's own loopback address (${slot}) if a listener takes it (the proxy on 0.0.0.0:${pod.outbound_port}), else to 127.0.0.1:${pod.outbound_port}`,
    };
  };
  const dns = (pod.flags & PodFlag.DNS) !== 0 && flow.port === DNS_PORT;
  const local = isLoopback(dst) || isPodAddr(pod, dst);
  const dnsServer = () => (pod.flags & PodFlag.DNS_ALL) !== 0 || maps.cidrMatch(netns, dst.bytes, CidrKind.DNS4);
  if (dst.family === 6 && !(pod.flags & PodFlag.IPV6)) return { verdict: 'not captured', decidedBy: 'IPv6 capture is off for this pod (mc_pods flags: no IPV6)' };
  if (maps.portIn(pod, netns, flow.port, PortKind.OUT_EXCLUDE)) return { verdict: 'not captured', decidedBy: `port ${flow.port} is excluded: ${kind('mc_ports OUT_EXCLUDE')}` };
  if (flow.protocol === 'udp') {
    if (flow.uid === pod.proxy_uid || flow.gid === pod.proxy_gid) return { verdict: 'not captured', decidedBy: `UDP from the proxy's uid/gid ${pod.proxy_uid}/${pod.proxy_gid} (mc_pods)` };
    if (!dns) return { verdict: 'not captured', decidedBy: 'UDP other than DNS is never captured' };
    if (dnsServer()) return { verdict: 'captured', to: to(pod.dns_port), decidedBy: `DNS capture (mc_pods flags${pod.flags & PodFlag.DNS_ALL ? ' DNS_ALL' : `, ${kind('mc_cidrs DNS')}`})` };
    return { verdict: 'not captured', decidedBy: `${flow.peer} is not one of the pod's DNS servers (no mc_cidrs DNS entry)` };
  }
  if (flow.uid === pod.proxy_uid) {
    if (local && !isHostLoopback(dst) && flow.port !== pod.tunnel_port && !dns) return { verdict: 'captured', to: to(pod.inbound_port), decidedBy: `the proxy (uid ${pod.proxy_uid}) to its own pod address: sent to the inbound port` };
    return { verdict: 'not captured', decidedBy: `the proxy's own connection (uid ${pod.proxy_uid}, mc_pods proxy_uid)` };
  }
  if (local && !dns) return { verdict: 'not captured', decidedBy: `${flow.peer} is loopback or one of the pod's own addresses (mc_pods addr)` };
  if (flow.gid === pod.proxy_gid) {
    if (local && !isHostLoopback(dst) && flow.port !== pod.tunnel_port) return { verdict: 'captured', to: to(pod.inbound_port), decidedBy: `the proxy's gid ${pod.proxy_gid} to its own pod address: sent to the inbound port` };
    return { verdict: 'not captured', decidedBy: `the proxy's gid ${pod.proxy_gid} (mc_pods proxy_gid)` };
  }
  if (dns && dnsServer()) return { verdict: 'captured', to: to(pod.dns_port), decidedBy: 'DNS over TCP to a captured DNS server' };
  if (isHostLoopback(dst)) return { verdict: 'not captured', decidedBy: `${flow.peer} is the host loopback` };
  if (maps.cidrMatch(netns, dst.bytes, CidrKind.OUT_EXCLUDE4)) return { verdict: 'not captured', decidedBy: `${flow.peer} is in an excluded range: ${kind('mc_cidrs OUT_EXCLUDE')}` };
  if (maps.portIn(pod, netns, flow.port, PortKind.OUT_INCLUDE)) return out(`port ${flow.port} is included: ${kind('mc_ports OUT_INCLUDE')}`);
  if (pod.flags & (dst.family === 4 ? PodFlag.OUT_ALL4 : PodFlag.OUT_ALL6)) return out('every destination is captured (mc_pods flags OUT_ALL: includeOutboundIPRanges "*")');
  if (maps.cidrMatch(netns, dst.bytes, CidrKind.OUT_INCLUDE4)) return out(`${flow.peer} is in an included range: ${kind('mc_cidrs OUT_INCLUDE')}`);
  return { verdict: 'not captured', decidedBy: `${flow.peer} matches no included range or port` };
}

function inboundVerdict(maps: PodMapReader, netns: bigint, pod: McPod, peer: { family: 4 | 6; bytes: Buffer }, flow: Flow, kind: (k: string) => string): KernelVerdict {
  if (flow.protocol !== 'tcp') return { verdict: 'not captured', decidedBy: 'only TCP is captured inbound' };
  if (!(pod.flags & PodFlag.IN_CAPTURE)) return { verdict: 'not captured', decidedBy: 'inbound capture is off for this pod (mc_pods flags: no IN_CAPTURE)' };
  if (peer.family === 6 && !(pod.flags & PodFlag.IPV6)) return { verdict: 'not captured', decidedBy: 'IPv6 capture is off for this pod (mc_pods flags: no IPV6)' };
  const passthrough6 = peer.family === 6 && peer.bytes.subarray(0, 15).every((b) => b === 0) && peer.bytes[15] === 6;
  if (isLoopback(peer) || passthrough6 || isPodAddr(pod, peer)) return { verdict: 'not captured', decidedBy: `${flow.peer} is the pod itself (loopback, passthrough or its own address)` };
  if (flow.port === pod.tunnel_port || flow.port === pod.inbound_port) return { verdict: 'not captured', decidedBy: `port ${flow.port} is the sidecar's own (${flow.port === pod.inbound_port ? 'inbound' : 'tunnel'} port)` };
  if (maps.portIn(pod, netns, flow.port, PortKind.IN_EXCLUDE)) return { verdict: 'not captured', decidedBy: `port ${flow.port} is excluded: ${kind('mc_ports IN_EXCLUDE')}` };
  const all = (pod.flags & PodFlag.IN_ALL) !== 0;
  if (!all && !maps.portIn(pod, netns, flow.port, PortKind.IN_INCLUDE)) return { verdict: 'not captured', decidedBy: `port ${flow.port} is not an included inbound port (no mc_ports IN_INCLUDE entry)` };
  const why = all ? 'every inbound port is captured (mc_pods flags IN_ALL)' : `port ${flow.port} is included: ${kind('mc_ports IN_INCLUDE')}`;
  const family = peer.family;
  if (maps.hasListener(netns, pod.inbound_port, family) || (family === 4 && maps.hasListener(netns, pod.inbound_port, 6))) {
    return { verdict: 'captured', to: `the proxy's listener on port ${pod.inbound_port}`, decidedBy: why };
  }
  return { verdict: 'refused', decidedBy: `${why}, but no proxy listener on port ${pod.inbound_port} is in mc_listen (the proxy is not listening yet, or mc_listen was full when it began to: the agent's self-check reports that): the connection is dropped rather than bypass the sidecar` };
}
