/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Address predicates, with no map: shared by the programs that include
 * mc_common.h and by the pod's inbound stub (inbound-stub.bpf.c), which
 * carries none of meshcap.h's maps.
 */
#ifndef MC_ADDR_H
#define MC_ADDR_H

#ifndef AF_INET
#define AF_INET 2 /* not in vmlinux.h (a macro) */
#endif

#define MC_INLINE static __always_inline

MC_INLINE void mc_v4mapped(__u8 out[16], __u32 ip4_be)
{
	__builtin_memset(out, 0, 10);
	out[10] = 0xff;
	out[11] = 0xff;
	__builtin_memcpy(out + 12, &ip4_be, 4);
}

MC_INLINE void mc_v6copy(__u8 out[16], const __u32 ip6[4])
{
	__builtin_memcpy(out, ip6, 16);
}

/* The first three words of a v4-mapped address (::ffff:0:0/96), for words
 * a program loaded one by one from a ctx or socket field. */
MC_INLINE bool mc_v4mapped_words(__u32 w0, __u32 w1, __u32 w2)
{
	return w0 == 0 && w1 == 0 && w2 == bpf_htonl(0x0000ffff);
}

MC_INLINE bool mc_is_v4mapped(const __u8 a[16])
{
	const __u32 *w = (const __u32 *)a;
	return mc_v4mapped_words(w[0], w[1], w[2]);
}

/* 127.0.0.0/8 or ::1 or ::ffff:127.0.0.0/104 */
/* Unspecified (0.0.0.0, ::): connect() to it reaches this host over
 * loopback, and the routing the iptables rules see has already made it
 * 127.0.0.1 / ::1 (__ip_route_output_key_hash), so it counts as that. */
MC_INLINE bool mc_is_unspecified(const __u8 a[16])
{
	const __u32 *w = (const __u32 *)a;
	if (mc_is_v4mapped(a))
		return w[3] == 0;
	return w[0] == 0 && w[1] == 0 && w[2] == 0 && w[3] == 0;
}

MC_INLINE bool mc_is_loopback(const __u8 a[16])
{
	const __u32 *w = (const __u32 *)a;
	if (mc_is_unspecified(a))
		return true;
	if (mc_is_v4mapped(a))
		return a[12] == 127;
	return w[0] == 0 && w[1] == 0 && w[2] == 0 && w[3] == bpf_htonl(1);
}

/* ::6, Envoy's IPv6 inbound passthrough source (127.0.0.6 for IPv4) */
MC_INLINE bool mc_is_passthrough6(const __u8 a[16])
{
	const __u32 *w = (const __u32 *)a;
	return w[0] == 0 && w[1] == 0 && w[2] == 0 && w[3] == bpf_htonl(6);
}

/*
 * An sk_lookup's two addresses as 16 bytes each (IPv4 v4-mapped). Every
 * field is loaded up front, on its own: clang otherwise merges the v4 and v6
 * paths into one load from a modified ctx pointer, which the verifier
 * refuses, or sinks the loads into later branches and merges them there.
 */
MC_INLINE void mc_lookup_addrs(struct bpf_sk_lookup *ctx, __u8 local[16], __u8 remote[16])
{
	__u32 l4 = ctx->local_ip4, r4 = ctx->remote_ip4;
	__u32 l6[4] = { ctx->local_ip6[0], ctx->local_ip6[1], ctx->local_ip6[2], ctx->local_ip6[3] };
	__u32 r6[4] = { ctx->remote_ip6[0], ctx->remote_ip6[1], ctx->remote_ip6[2], ctx->remote_ip6[3] };

	barrier_var(l4);
	barrier_var(r4);
	for (int i = 0; i < 4; i++) {
		barrier_var(l6[i]);
		barrier_var(r6[i]);
	}
	if (ctx->family == AF_INET) {
		mc_v4mapped(local, l4);
		mc_v4mapped(remote, r4);
	} else {
		__builtin_memcpy(local, l6, 16);
		__builtin_memcpy(remote, r6, 16);
	}
}

/*
 * The pod's own connection, which inbound capture never takes (NAT in
 * PREROUTING never re-decides it): a loopback or unspecified address on
 * either side (the app to its proxy: every redirected outbound connection),
 * or the proxy's passthrough source (127.0.0.6 is loopback; ::6 for IPv6).
 * mc_is_loopback and mc_is_passthrough6, read from the ctx's words: the
 * pod's stub asks it before its tail call, where building the 16-byte
 * addresses cost ~18 ns per connection more (bpf_stats, 2026-11-30).
 */
MC_INLINE bool mc_own4(__u32 a)
{
	/* network order: the first octet is the low byte */
	return (a & 0xff) == 127 || a == 0;
}

MC_INLINE bool mc_own6(__u32 w0, __u32 w1, __u32 w2, __u32 w3)
{
	if ((w0 | w1) != 0)
		return false;
	if (w2 == bpf_htonl(0x0000ffff)) /* v4-mapped: 127.0.0.0/8 or 0.0.0.0 */
		return mc_own4(w3);
	return w2 == 0 && (w3 == bpf_htonl(1) || w3 == 0);
}

/* An IPv6 destination slot's address, 100::/64 (meshcap.h, "IPv6
 * destination slots"): only the pod's own redirected connections are sent
 * there, from one of its addresses. Unlike 127/8 and ::1 the kernel does not
 * refuse it from outside, so the programs that answer for it check the peer
 * (mc_inbound_decide, mc_slotted in origdst.bpf.c). */
#define MC_SLOT6_W0 0x01000000 /* the first word, host order: 0100:0000 */
MC_INLINE bool mc_slot6_words(__u32 w0, __u32 w1, __u32 w2)
{
	return w0 == bpf_htonl(MC_SLOT6_W0) && w1 == 0 && w2 == 0;
}

MC_INLINE bool mc_lookup_own(struct bpf_sk_lookup *ctx)
{
	if (ctx->family == AF_INET) {
		__u32 l = ctx->local_ip4, r = ctx->remote_ip4;

		barrier_var(l);
		barrier_var(r);
		return mc_own4(l) || mc_own4(r);
	}
	__u32 l0 = ctx->local_ip6[0], l1 = ctx->local_ip6[1], l2 = ctx->local_ip6[2], l3 = ctx->local_ip6[3];
	__u32 r0 = ctx->remote_ip6[0], r1 = ctx->remote_ip6[1], r2 = ctx->remote_ip6[2], r3 = ctx->remote_ip6[3];

	barrier_var(l3);
	barrier_var(r3);
	return mc_own6(l0, l1, l2, l3) || mc_own6(r0, r1, r2, r3) ||
	       ((r0 | r1 | r2) == 0 && r3 == bpf_htonl(6));
}

#endif /* MC_ADDR_H */
