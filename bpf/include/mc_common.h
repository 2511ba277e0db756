/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Small helpers shared by the meshcap BPF programs. */
#ifndef MC_COMMON_H
#define MC_COMMON_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "meshcap.h"
#include "mc_addr.h"

#define AF_INET6 10
#define SOCK_STREAM 1
#define SOCK_DGRAM 2
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define SOL_IP 0
#define SOL_IPV6 41
#define SO_ORIGINAL_DST 80
#define IP6T_SO_ORIGINAL_DST 80
#define DNS_PORT 53

MC_INLINE struct mc_pod *mc_pod_of(__u64 netns)
{
	return bpf_map_lookup_elem(&mc_pods, &netns);
}

/* Is addr one of the pod's own addresses (its traffic would leave via lo)? */
MC_INLINE bool mc_is_pod_addr(const struct mc_pod *pod, const __u8 a[16])
{
	if (mc_is_v4mapped(a)) {
		__u32 ip;
		__builtin_memcpy(&ip, a + 12, 4);
#pragma unroll
		for (int i = 0; i < MC_POD_ADDRS; i++) {
			__u32 p;
			__builtin_memcpy(&p, pod->addr4[i], 4);
			if (i < pod->n_addr4 && p == ip)
				return true;
		}
		return false;
	}
	const __u64 *q = (const __u64 *)a;
#pragma unroll
	for (int i = 0; i < MC_POD_ADDRS; i++) {
		const __u64 *p = (const __u64 *)pod->addr6[i];
		if (i < pod->n_addr6 && p[0] == q[0] && p[1] == q[1])
			return true;
	}
	return false;
}

MC_INLINE bool mc_port_in(const struct mc_pod *pod, __u64 netns, __u16 port, __u8 kind)
{
	struct mc_port_key k = {};
	struct mc_portrange_key rk = {};
	struct mc_portrange *r;

	k.netns = netns;
	k.port = port;
	k.kind = kind;
	if (bpf_map_lookup_elem(&mc_ports, &k))
		return true;
	if (!(pod->flags & MC_F_PORT_RANGES))
		return false;
	rk.netns = netns;
	rk.kind = kind;
#pragma unroll
	for (int i = 0; i < MC_PORT_RANGES; i++) {
		rk.idx = i;
		r = bpf_map_lookup_elem(&mc_portranges, &rk);
		if (!r)
			return false;
		if (port >= r->lo && port <= r->hi)
			return true;
	}
	return false;
}

/* kind4 is used for v4 (and v4-mapped) addresses, kind4 + 2 for v6. */
MC_INLINE bool mc_cidr_match(__u64 netns, const __u8 a[16], __u8 kind4)
{
	struct mc_cidr_key k = {};
	k.netns = netns;
	if (mc_is_v4mapped(a)) {
		k.kind = kind4;
		k.prefixlen = MC_CIDR_KEY_BITS + 32;
		__builtin_memcpy(k.addr, a + 12, 4);
	} else {
		k.kind = kind4 + 2;
		k.prefixlen = MC_CIDR_KEY_BITS + 128;
		__builtin_memcpy(k.addr, a, 16);
	}
	return bpf_map_lookup_elem(&mc_cidrs, &k) != NULL;
}

/*
 * The pod's slot a loopback address names (a in network order), or 0 for
 * 127.0.0.0, 127.0.0.1, 127.0.0.6 and 127.255.255.255 and anything outside
 * 127.0.0.0/8: those never stand for a destination (struct mc_slot_key).
 */
MC_INLINE __u32 mc_slot_of4(__u32 a)
{
	__u32 h = bpf_ntohl(a);

	if ((h >> 24) != 127)
		return 0;
	h &= 0x00ffffff;
	if (h == 0 || h == 1 || h == 6 || h == 0x00ffffff)
		return 0;
	return h;
}

/*
 * The original destination of a connection between a pod's app and its
 * proxy, named by the connection's loopback address a (network order) and
 * the proxy's port: NULL when a names no slot of the pod or the slot was
 * made for another port.
 */
MC_INLINE struct mc_slot *mc_slot_lookup(__u64 netns, __u32 a, __u16 to)
{
	struct mc_slot_key k = {};
	struct mc_slot *v;

	k.slot = mc_slot_of4(a);
	if (!k.slot)
		return NULL;
	k.netns = netns;
	v = bpf_map_lookup_elem(&mc_dstslot, &k);
	if (!v || v->to != to)
		return NULL;
	return v;
}

/* The IPv6 slot a connection's 100::S address names, if it is the pod's
 * slot for outbound port `to` (meshcap.h, "IPv6 destination slots"). */
MC_INLINE struct mc_slot6 *mc_slot6_lookup(__u64 netns, __u32 w0, __u32 w1, __u32 w2, __u32 w3, __u16 to)
{
	struct mc_slot_key k = {};
	struct mc_slot6 *v;

	if (!mc_slot6_words(w0, w1, w2) || w3 == 0)
		return NULL;
	k.netns = netns;
	k.slot = bpf_ntohl(w3);
	v = bpf_map_lookup_elem(&mc_dstslot6, &k);
	if (!v || v->to != to)
		return NULL;
	return v;
}

#define MC_STAT_INC(netns, field)                                        \
	do {                                                             \
		__u64 __n = (netns);                                     \
		struct mc_stats *__s = bpf_map_lookup_elem(&mc_stats, &__n); \
		if (__s)                                                 \
			__sync_fetch_and_add(&__s->field, 1);            \
	} while (0)

#endif /* MC_COMMON_H */
