// Mirrors bpf/include/meshcap.h. Keep in step with it: test/unit/maps/btf-layout
// compares every struct here with the BTF of the compiled objects.
import { defineStruct } from './struct.js';

export const MC_POD_ADDRS = 4;
export const MC_CIDR_KEY_BITS = 96;

export const PodFlag = {
  OUT_ALL4: 1 << 0,
  OUT_ALL6: 1 << 1,
  IN_CAPTURE: 1 << 2,
  IN_ALL: 1 << 3,
  DNS: 1 << 4,
  DNS_ALL: 1 << 5,
  TPROXY: 1 << 6,
  IPV6: 1 << 7,
  PORT_RANGES: 1 << 8,
  NO_OUT_XPORTS: 1 << 9,
  NO_OUT_IPORTS: 1 << 10,
  NO_OUT_XCIDRS: 1 << 11,
} as const;

export const CidrKind = { OUT_EXCLUDE4: 1, OUT_INCLUDE4: 2, OUT_EXCLUDE6: 3, OUT_INCLUDE6: 4, DNS4: 5, DNS6: 6 } as const;
export const PortKind = { OUT_EXCLUDE: 1, OUT_INCLUDE: 2, IN_EXCLUDE: 3, IN_INCLUDE: 4 } as const;
export const OrigKind = { OUTBOUND: 1, OWN_POD: 2 } as const;

export interface McPod {
  outbound_port: number;
  inbound_port: number;
  tunnel_port: number;
  dns_port: number;
  proxy_uid: number;
  proxy_gid: number;
  flags: number;
  n_addr4: number;
  n_addr6: number;
  pad?: Buffer;
  addr4: Buffer; // 4 x 4
  addr6: Buffer; // 4 x 16
}
export const mcPod = defineStruct<McPod>('mc_pod', [
  { name: 'outbound_port', kind: 'u16' },
  { name: 'inbound_port', kind: 'u16' },
  { name: 'tunnel_port', kind: 'u16' },
  { name: 'dns_port', kind: 'u16' },
  { name: 'proxy_uid', kind: 'u32' },
  { name: 'proxy_gid', kind: 'u32' },
  { name: 'flags', kind: 'u32' },
  { name: 'n_addr4', kind: 'u8' },
  { name: 'n_addr6', kind: 'u8' },
  { name: 'pad', kind: 'bytes', length: 2 },
  { name: 'addr4', kind: 'bytes', length: 4 * MC_POD_ADDRS },
  { name: 'addr6', kind: 'bytes', length: 16 * MC_POD_ADDRS },
]);

export interface McCidrKey { prefixlen: number; kind: number; pad?: Buffer; netns: bigint; addr: Buffer }
export const mcCidrKey = defineStruct<McCidrKey>('mc_cidr_key', [
  { name: 'prefixlen', kind: 'u32' },
  { name: 'kind', kind: 'u8' },
  { name: 'pad', kind: 'bytes', length: 3 },
  { name: 'netns', kind: 'u64' },
  { name: 'addr', kind: 'bytes', length: 16 },
]);

export interface McPortKey { netns: bigint; port: number; kind: number; pad?: Buffer }
export const mcPortKey = defineStruct<McPortKey>('mc_port_key', [
  { name: 'netns', kind: 'u64' },
  { name: 'port', kind: 'u16' },
  { name: 'kind', kind: 'u8' },
  { name: 'pad', kind: 'bytes', length: 5 },
]);

/** Wide port ranges per pod and kind (bpf/include/meshcap.h MC_PORT_RANGES). */
export const MC_PORT_RANGES = 8;
export interface McPortRangeKey { netns: bigint; kind: number; idx: number; pad?: Buffer }
export const mcPortRangeKey = defineStruct<McPortRangeKey>('mc_portrange_key', [
  { name: 'netns', kind: 'u64' },
  { name: 'kind', kind: 'u8' },
  { name: 'idx', kind: 'u8' },
  { name: 'pad', kind: 'bytes', length: 6 },
]);
export interface McPortRange { lo: number; hi: number; pad?: number }
export const mcPortRange = defineStruct<McPortRange>('mc_portrange', [
  { name: 'lo', kind: 'u16' },
  { name: 'hi', kind: 'u16' },
  { name: 'pad', kind: 'u32' },
]);

export interface McTuple { netns: bigint; laddr: Buffer; raddr: Buffer; lport: number; rport: number; pad?: number }
export const mcTuple = defineStruct<McTuple>('mc_tuple', [
  { name: 'netns', kind: 'u64' },
  { name: 'laddr', kind: 'bytes', length: 16 },
  { name: 'raddr', kind: 'bytes', length: 16 },
  { name: 'lport', kind: 'u16' },
  { name: 'rport', kind: 'u16' },
  { name: 'pad', kind: 'u32' },
]);

export interface McOrig { addr: Buffer; port: number; family: number; kind: number; pad?: number; netns: bigint }
export const mcOrig = defineStruct<McOrig>('mc_orig', [
  { name: 'addr', kind: 'bytes', length: 16 },
  { name: 'port', kind: 'u16' },
  { name: 'family', kind: 'u8' },
  { name: 'kind', kind: 'u8' },
  { name: 'pad', kind: 'u32' },
  { name: 'netns', kind: 'u64' },
]);

export interface McStats { outbound: bigint; own_pod: bigint; inbound: bigint; dns: bigint; origdst: bigint }
export const mcStats = defineStruct<McStats>('mc_stats', [
  { name: 'outbound', kind: 'u64' },
  { name: 'own_pod', kind: 'u64' },
  { name: 'inbound', kind: 'u64' },
  { name: 'dns', kind: 'u64' },
  { name: 'origdst', kind: 'u64' },
]);

/** Slots per (pod, family) in mc_listen: one per socket of a SO_REUSEPORT group (bpf/include/meshcap.h). */
export const MC_LISTEN_SLOTS = 4;
export interface McListenKey { netns: bigint; port: number; family: number; slot: number; pad?: Buffer }
export const mcListenKey = defineStruct<McListenKey>('mc_listen_key', [
  { name: 'netns', kind: 'u64' },
  { name: 'port', kind: 'u16' },
  { name: 'family', kind: 'u8' },
  { name: 'slot', kind: 'u8' },
  { name: 'pad', kind: 'bytes', length: 4 },
]);

/**
 * A pod's destination slot (bpf/include/meshcap.h struct mc_slot_key): the
 * kernel's programs make them (connect4/6), the agent only removes a gone
 * pod's. slot is the low 24 bits of the loopback address 127.x.y.z.
 */
export interface McSlotKey { netns: bigint; slot: number; pad?: number }
export const mcSlotKey = defineStruct<McSlotKey>('mc_slot_key', [
  { name: 'netns', kind: 'u64' },
  { name: 'slot', kind: 'u32' },
  { name: 'pad', kind: 'u32' },
]);
export interface McSlot { addr: Buffer; port: number; to: number }
export const mcSlot = defineStruct<McSlot>('mc_slot', [
  { name: 'addr', kind: 'bytes', length: 4 },
  { name: 'port', kind: 'u16' },
  { name: 'to', kind: 'u16' },
]);

/** An IPv6 destination slot's value (struct mc_slot6): the slot is the last 32 bits of 100::S. */
export interface McSlot6 { addr: Buffer; port: number; to: number; pad?: number }
export const mcSlot6 = defineStruct<McSlot6>('mc_slot6', [
  { name: 'addr', kind: 'bytes', length: 16 },
  { name: 'port', kind: 'u16' },
  { name: 'to', kind: 'u16' },
  { name: 'pad', kind: 'u32' },
]);

/**
 * A pod whose redirected IPv6 connections may take IPv6 slots (struct
 * mc_v6spill): the agent writes it with open 0 once the pod's lo routes
 * 100::/64; sockops keeps `open`, connect6 spills from `at` on.
 */
export interface McV6Spill { open: bigint; at: bigint }
export const mcV6Spill = defineStruct<McV6Spill>('mc_v6spill', [
  { name: 'open', kind: 'i64' },
  { name: 'at', kind: 'i64' },
]);

export const ALL_LAYOUTS = [mcPod, mcCidrKey, mcPortKey, mcPortRangeKey, mcPortRange, mcTuple, mcOrig, mcStats, mcListenKey, mcSlotKey, mcSlot, mcSlot6, mcV6Spill];

/** u64 keys (netns cookie, socket cookie) as the kernel stores them. */
export function u64Key(v: bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(v);
  return b;
}

/** Map names, as pinned under <pin root>/maps. */
export const MAP = {
  pods: 'mc_pods',
  cidrs: 'mc_cidrs',
  ports: 'mc_ports',
  portranges: 'mc_portranges',
  stats: 'mc_stats',
  sockorig: 'mc_sockorig',
  origdst: 'mc_origdst',
  skorig: 'mc_skorig',
  listen: 'mc_listen',
  dnsorig: 'mc_dnsorig',
  dstslot: 'mc_dstslot',
  dstslot6: 'mc_dstslot6',
  v6spill: 'mc_v6spill',
} as const;

/** Maps a datapath pinned by an older meshcap lacks: readers open them only where they exist. */
export const MAPS_ADDED_LATER: ReadonlySet<string> = new Set([MAP.portranges, MAP.dstslot, MAP.dstslot6, MAP.v6spill]);
