/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * meshcap: structs and maps shared by every BPF object and mirrored by the
 * TypeScript codecs in src/maps/layout.ts (a test compares both with the BTF
 * of the compiled objects, so change them together).
 *
 * Every object defines the maps it uses from this header; the loader pins
 * maps by name, so all objects share one instance of each.
 *
 * Conventions: ports are host byte order; addresses are 16 bytes with IPv4
 * stored IPv4-mapped (::ffff:a.b.c.d) so v4, v6 and v4-mapped-v6 sockets use
 * one key shape; a pod is its network namespace cookie.
 */
#ifndef MESHCAP_H
#define MESHCAP_H

#define MC_MAX_PODS 16384
#define MC_MAX_CIDRS 65536
#define MC_MAX_PORTS 65536
#define MC_MAX_PORT_RANGES 65536
/* The three LRU maps: these are the defaults only. The loader sets each
 * one's max_entries before load (--origdst-entries, --sockorig-entries,
 * --dnsorig-entries; a pinned map keeps its size): src/loader/map-sizes.ts,
 * the arithmetic in docs/datapath.md "Map sizes and memory". */
#define MC_MAX_ORIGDST 65536  /* TCP connections between SYN and the proxy side's handshake */
#define MC_MAX_SOCKORIG 16384 /* TCP connects inside connect() */
#define MC_MAX_DNSORIG 65536  /* UDP DNS sockets, most recently used */
#define MC_MAX_LISTEN 65536 /* listening sockets (one per SO_REUSEPORT socket, up to MC_LISTEN_SLOTS per listener); the default of --listen-entries, which the loader sets (src/loader/map-sizes.ts) */
#define MC_POD_ADDRS 4
/* mc_dstslot: (pod, 127.x address) -> the original destination it stands for.
 * Entries are made by connect4/6 on a destination's first redirected connect
 * and live as long as the pod (the agent removes a deleted pod's): memory as
 * used (no prealloc). Full: connects fall back to 127.0.0.1 and the sockets'
 * own storage, as before slots. */
#define MC_MAX_DSTSLOTS 65536
/* mc_dstslot6: (pod, 100::S) -> the IPv6 destination it stands for, made only
 * past a pod's mc_v6spill.at connections open on [::1] (rare: 14,116 at the
 * default range); full, connections stay on [::1] as before IPv6 slots. Its
 * bucket array (16 B an entry) is kernel memory at any fill, kept small. */
#define MC_MAX_DSTSLOTS6 4096
/* Tries per destination for a free 127.x address of the pod (hash probes). */
#define MC_SLOT_PROBES 4

/* mc_pod.flags */
#define MC_F_OUT_ALL4 (1u << 0)   /* includeOutboundIPRanges '*' (v4) */
#define MC_F_OUT_ALL6 (1u << 1)   /* includeOutboundIPRanges '*' (v6) */
#define MC_F_IN_CAPTURE (1u << 2) /* inbound capture on (includeInboundPorts not empty) */
#define MC_F_IN_ALL (1u << 3)     /* includeInboundPorts '*' */
#define MC_F_DNS (1u << 4)        /* redirect DNS to dns_port */
#define MC_F_DNS_ALL (1u << 5)    /* capture all DNS, not only the listed servers */
#define MC_F_TPROXY (1u << 6)     /* interceptionMode TPROXY */
#define MC_F_IPV6 (1u << 7)       /* capture IPv6 too (istio EnableIPv6) */
#define MC_F_PORT_RANGES (1u << 8) /* some of its port lists are in mc_portranges */
/* The pod has no entries of a kind (Istio's default pod has none of these):
 * connect4/6 skip those lookups. Set only when there are none, so an entry
 * written without them (an agent of the version before) still gets every
 * lookup. */
#define MC_F_NO_OUT_XPORTS (1u << 9)  /* no excludeOutboundPorts (mc_ports, mc_portranges) */
#define MC_F_NO_OUT_IPORTS (1u << 10) /* no includeOutboundPorts */
#define MC_F_NO_OUT_XCIDRS (1u << 11) /* no excludeOutboundIPRanges (mc_cidrs, v4 and v6) */

/*
 * IPv6 destination slots. IPv6 has one loopback address, and ::1 keeps
 * tcp_tw_reuse=2 for the app's TIME_WAIT ports, so redirected IPv6
 * connections go to [::1]:15001 first. Their ports then share one range,
 * where under iptables each destination has its own; so once a pod has
 * mc_v6spill.at redirected IPv6 connections open on ::1, the next ones go
 * to a slot address of their destination in 100::/64,
 * routed to lo in the pod (local 100::/64 dev lo): a range per destination,
 * as iptables gives, past the ones ::1 holds. 100::/64 is RFC 6666's
 * discard-only prefix: should the route be missing, a connection sent there
 * is dropped on the way, never delivered anywhere. The slot is the address's
 * last 32 bits (MC_SLOT6_W0 in mc_addr.h).
 */

struct mc_pod {
	__u16 outbound_port; /* 15001 */
	__u16 inbound_port;  /* 15006 */
	__u16 tunnel_port;   /* 15008, 0 = none */
	__u16 dns_port;      /* 15053 */
	__u32 proxy_uid;     /* 1337 */
	__u32 proxy_gid;     /* 1337 */
	__u32 flags;         /* MC_F_* */
	__u8 n_addr4;
	__u8 n_addr6;
	__u8 pad[2];
	__u8 addr4[MC_POD_ADDRS][4];  /* the pod's own addresses: "-o lo" */
	__u8 addr6[MC_POD_ADDRS][16];
};

/* mc_cidrs: LPM trie, prefixlen = MC_CIDR_KEY_BITS + CIDR bits. */
#define MC_CIDR_OUT_EXCLUDE4 1
#define MC_CIDR_OUT_INCLUDE4 2
#define MC_CIDR_OUT_EXCLUDE6 3
#define MC_CIDR_OUT_INCLUDE6 4
#define MC_CIDR_DNS4 5
#define MC_CIDR_DNS6 6
#define MC_CIDR_KEY_BITS 96 /* kind + pad + netns */

struct mc_cidr_key {
	__u32 prefixlen;
	__u8 kind;
	__u8 pad[3];
	__u64 netns;
	__u8 addr[16]; /* v4: first 4 bytes */
};

/* mc_ports: exact port sets per pod */
#define MC_PORT_OUT_EXCLUDE 1
#define MC_PORT_OUT_INCLUDE 2
#define MC_PORT_IN_EXCLUDE 3
#define MC_PORT_IN_INCLUDE 4

struct mc_port_key {
	__u64 netns;
	__u16 port;
	__u8 kind;
	__u8 pad[5];
};

/* Wide port ranges (e.g. excludeOutboundPorts 1024:65535) as ranges, not as
 * one mc_ports entry per port in the node-wide table: up to MC_PORT_RANGES
 * per pod and kind, idx 0.. without gaps. */
#define MC_PORT_RANGES 8
struct mc_portrange_key {
	__u64 netns;
	__u8 kind;
	__u8 idx;
	__u8 pad[6];
};

struct mc_portrange {
	__u16 lo;
	__u16 hi;
	__u32 pad;
};

/* A connection as one socket sees it. */
struct mc_tuple {
	__u64 netns;
	__u8 laddr[16];
	__u8 raddr[16];
	__u16 lport;
	__u16 rport;
	__u32 pad;
};

#define MC_ORIG_OUTBOUND 1 /* app -> outbound port */
#define MC_ORIG_OWN_POD 2  /* proxy -> own pod address -> inbound port */

/* Original destination, carried connect -> sockops -> proxy's socket. */
struct mc_orig {
	__u8 addr[16];
	__u16 port;
	__u8 family; /* 4 or 6: what SO_ORIGINAL_DST reports */
	__u8 kind;   /* MC_ORIG_* */
	__u32 pad;
	__u64 netns;
};

/*
 * A redirected IPv4 connection's loopback address names its original
 * destination: connect4/6 send the app's socket to 127.S:outbound_port,
 * where S (the low 24 bits) is the pod's slot for that destination, so the
 * proxy's SO_ORIGINAL_DST and the app's getpeername() are a lookup of the
 * connection's own address: nothing to allocate, carry or free per
 * connection (docs/datapath.md "Destination slots").
 */
struct mc_slot_key {
	__u64 netns;
	__u32 slot; /* host order, 0x000002 .. 0xfffffe, never 1 (127.0.0.1) nor 6 (127.0.0.6) */
	__u32 pad;
};

struct mc_slot {
	__u8 addr[4]; /* the original destination, network order */
	__u16 port;   /* its port, host order */
	__u16 to;     /* the outbound port the connection was sent to */
};

/* A pod whose redirected IPv6 connections may take IPv6 slots: the agent
 * writes the entry (open 0) once the pod's lo routes 100::/64. */
struct mc_v6spill {
	__s64 open; /* its redirected IPv6 connections open on [::1] at the outbound
		     * port (sockops: + at TCP_CONNECT_CB, - when the socket leaves
		     * for TCP_CLOSE, TIME_WAIT included: ::1 lets the app reuse
		     * those ports) */
	__s64 at;   /* from this many on, slots (the agent: half the pod's
		     * ephemeral port range) */
};

struct mc_slot6 {
	__u8 addr[16]; /* the original destination */
	__u16 port;    /* its port, host order */
	__u16 to;      /* the outbound port the connection was sent to */
	__u32 pad;
};

/* Per-pod counters, created by the agent when the pod is registered. */
struct mc_stats {
	__u64 outbound;  /* connects redirected to outbound_port */
	__u64 own_pod;   /* proxy -> own pod redirected to inbound_port */
	__u64 inbound;   /* inbound connections steered to inbound_port */
	__u64 dns;       /* DNS sends/connects redirected to dns_port */
	__u64 origdst;   /* SO_ORIGINAL_DST answered */
};

/* A proxy's inbound listeners: one slot per socket of a SO_REUSEPORT group
 * (up to MC_LISTEN_SLOTS), so closing one of them leaves the others reachable. */
#define MC_LISTEN_SLOTS 4
struct mc_listen_key {
	__u64 netns;
	__u16 port;
	__u8 family;
	__u8 slot;
	__u8 pad[4];
};

#ifdef __BPF__
/* Map definitions, only in BPF objects. Every object carries all of them;
 * the loader pins them by name, so all objects share one instance of each. */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MC_MAX_PODS);
	__type(key, __u64);
	__type(value, struct mc_pod);
} mc_pods SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, MC_MAX_CIDRS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct mc_cidr_key);
	__type(value, __u8);
} mc_cidrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MC_MAX_PORTS);
	__type(key, struct mc_port_key);
	__type(value, __u8);
} mc_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, MC_MAX_PORT_RANGES);
	__type(key, struct mc_portrange_key);
	__type(value, struct mc_portrange);
} mc_portranges SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MC_MAX_PODS);
	__type(key, __u64);
	__type(value, struct mc_stats);
} mc_stats SEC(".maps");

/* socket cookie of the app socket -> original destination (connect -> sockops) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MC_MAX_SOCKORIG);
	__type(key, __u64);
	__type(value, struct mc_orig);
} mc_sockorig SEC(".maps");

/* app socket's tuple -> original destination (sockops -> proxy's socket) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MC_MAX_ORIGDST);
	__type(key, struct mc_tuple);
	__type(value, struct mc_orig);
} mc_origdst SEC(".maps");

/* A redirected app socket's original destination, for getpeername/getsockname
 * (peername.bpf.c) to show what iptables REDIRECT shows: freed with the socket. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct mc_orig);
} mc_apporig SEC(".maps");

/* The proxy's accepted socket owns its original destination: freed with the socket. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct mc_orig);
} mc_skorig SEC(".maps");

/* Listening proxy sockets per pod, for sk_lookup steering (inbound). */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, MC_MAX_LISTEN);
	__type(key, struct mc_listen_key);
	__type(value, __u64);
} mc_listen SEC(".maps");

/* UDP DNS: socket cookie -> the resolver the app addressed (reply source). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MC_MAX_DNSORIG);
	__type(key, __u64);
	__type(value, struct mc_orig);
} mc_dnsorig SEC(".maps");

/* (pod, slot) -> original destination; see struct mc_slot_key. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, MC_MAX_DSTSLOTS);
	__type(key, struct mc_slot_key);
	__type(value, struct mc_slot);
} mc_dstslot SEC(".maps");

/* (pod, slot) -> original IPv6 destination (100::slot); see MC_SLOT6_W0. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, MC_MAX_DSTSLOTS6);
	__type(key, struct mc_slot_key);
	__type(value, struct mc_slot6);
} mc_dstslot6 SEC(".maps");

/* pod -> struct mc_v6spill; the agent writes and removes it with the pod. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, MC_MAX_PODS);
	__type(key, __u64);
	__type(value, struct mc_v6spill);
} mc_v6spill SEC(".maps");

#endif /* __BPF__ */
#endif /* MESHCAP_H */
