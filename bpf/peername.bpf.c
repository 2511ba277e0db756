// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The app's and the proxy's view of a redirected socket, as iptables
 * REDIRECT leaves them: connect() was rewritten to the proxy on loopback, but
 * the app's getpeername() must still return the original destination, not
 * 127.0.0.1:15001. Its getsockname(), and the proxy's accept() and
 * getpeername(), give the pod's address: outbound.bpf.c binds it before the
 * rewrite, or, for an IPv4 connection sent to a slot (mc_src_view there),
 * leaves the socket to routing (127.0.0.1) and mc_getsockname4 and
 * mc_getpeername4/6 name the pod's address for the connection's loopback
 * one. A TCP socket's original destination is named by its peer's
 * loopback address (a slot in mc_dstslot) or kept in mc_apporig
 * (connect4/6 set it); a connected UDP socket redirected to the DNS proxy has it
 * in mc_dnsorig. Attached at the cgroup v2 root; optional (the cgroup
 * getpeername hooks are 5.8+): without it only the app's getpeername differs.
 */
#include "mc_common.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

MC_INLINE struct mc_orig *mc_orig_of(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	__u64 cookie;

	if (!sk)
		return NULL;
	if (ctx->type == SOCK_STREAM)
		return bpf_sk_storage_get(&mc_apporig, sk, 0, 0);
	cookie = bpf_get_socket_cookie(ctx);
	return bpf_map_lookup_elem(&mc_dnsorig, &cookie);
}

/* A slotted TCP connection (outbound.bpf.c): the peer the kernel is about to
 * report, 127.S at the outbound port, names the original destination. */
MC_INLINE struct mc_slot *mc_slot_of_peer(struct bpf_sock_addr *ctx, __u32 peer)
{
	if (ctx->type != SOCK_STREAM)
		return NULL;
	return mc_slot_lookup(bpf_get_netns_cookie(ctx), peer, bpf_ntohs(ctx->user_port));
}

#define MC_LO4 bpf_htonl(0x7f000001)

/* The pod's first IPv4 address (network order), what REDIRECT's source was
 * for a socket the app left unbound. */
MC_INLINE bool mc_pod_src4(__u64 netns, __u32 *a)
{
	struct mc_pod *pod = mc_pod_of(netns);

	if (!pod || pod->n_addr4 == 0)
		return false;
	__builtin_memcpy(a, pod->addr4[0], 4);
	return true;
}

/*
 * 127.0.0.1 on one end of a slotted connection (outbound.bpf.c, mc_src_view)
 * stands for the pod's address: the slot, the other end's address at the
 * outbound port, says the connection is one connect4 sent there. *a: the
 * pod's address.
 */
MC_INLINE bool mc_slotted_lo4(struct bpf_sock_addr *ctx, __u32 slot_addr, __u16 port, __u32 *a)
{
	__u64 netns;

	if (!mc_slot_of4(slot_addr))
		return false;
	netns = bpf_get_netns_cookie(ctx);
	return mc_slot_lookup(netns, slot_addr, port) && mc_pod_src4(netns, a);
}

/* The app's socket: 127.0.0.1 -> 127.S:15001 reads as the pod's address. */
SEC("cgroup/getsockname4")
int mc_getsockname4(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	__u32 peer, a;
	__u16 port;

	if (!sk || ctx->type != SOCK_STREAM || ctx->user_ip4 != MC_LO4)
		return 1;
	peer = sk->dst_ip4;
	port = sk->dst_port;
	if (mc_slotted_lo4(ctx, peer, bpf_ntohs(port), &a))
		ctx->user_ip4 = a;
	return 1;
}

/* The same through an AF_INET6 socket: ::ffff:127.0.0.1 -> ::ffff:127.S:15001. */
SEC("cgroup/getsockname6")
int mc_getsockname6(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	__u32 p0, p1, p2, p3, a;
	__u16 port;

	if (!sk || ctx->type != SOCK_STREAM || ctx->user_ip6[3] != MC_LO4 ||
	    !mc_v4mapped_words(ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2]))
		return 1;
	p0 = sk->dst_ip6[0];
	p1 = sk->dst_ip6[1];
	p2 = sk->dst_ip6[2];
	p3 = sk->dst_ip6[3];
	barrier_var(p3);
	port = sk->dst_port;
	if (mc_v4mapped_words(p0, p1, p2) && mc_slotted_lo4(ctx, p3, bpf_ntohs(port), &a))
		ctx->user_ip6[3] = a;
	return 1;
}

SEC("cgroup/getpeername4")
int mc_getpeername4(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	struct mc_orig *o;
	struct mc_slot *v;
	__u32 a;

	/* The proxy's socket (accept() asks here too): 127.S:15001 <- 127.0.0.1
	 * reads as from the pod's address. Asked first: such a socket has no
	 * storage, and an app's socket has no slot as its own address. */
	if (sk && ctx->type == SOCK_STREAM && ctx->user_ip4 == MC_LO4) {
		__u32 local = sk->src_ip4;

		if (mc_slotted_lo4(ctx, local, (__u16)sk->src_port, &a)) {
			ctx->user_ip4 = a;
			return 1;
		}
	}
	o = mc_orig_of(ctx);
	if (!o) {
		v = mc_slot_of_peer(ctx, ctx->user_ip4);
		if (!v)
			return 1;
		__builtin_memcpy(&a, v->addr, 4);
		ctx->user_ip4 = a;
		ctx->user_port = bpf_htons(v->port);
		return 1;
	}
	if (o->family != 4)
		return 1;
	__builtin_memcpy(&a, o->addr + 12, 4);
	ctx->user_ip4 = a;
	ctx->user_port = bpf_htons(o->port);
	return 1;
}

SEC("cgroup/getpeername6")
int mc_getpeername6(struct bpf_sock_addr *ctx)
{
	struct mc_orig *o = mc_orig_of(ctx);
	struct mc_slot *v;
	__u32 w[4];

	if (!o) {
		/* a v4 destination reached through an AF_INET6 socket: ::ffff:127.S */
		w[0] = ctx->user_ip6[0];
		w[1] = ctx->user_ip6[1];
		w[2] = ctx->user_ip6[2];
		w[3] = ctx->user_ip6[3];
		/* a dual-stack proxy's socket of a slotted IPv4 connection:
		 * ::ffff:127.S:15001 <- ::ffff:127.0.0.1 (mc_getpeername4) */
		if (mc_v4mapped_words(w[0], w[1], w[2]) && w[3] == MC_LO4 && ctx->type == SOCK_STREAM) {
			struct bpf_sock *sk = ctx->sk;
			__u32 l0, l1, l2, l3, a;

			if (!sk)
				return 1;
			l0 = sk->src_ip6[0];
			l1 = sk->src_ip6[1];
			l2 = sk->src_ip6[2];
			l3 = sk->src_ip6[3];
			barrier_var(l3);
			if (mc_v4mapped_words(l0, l1, l2) && mc_slotted_lo4(ctx, l3, (__u16)sk->src_port, &a))
				ctx->user_ip6[3] = a;
			return 1;
		}
		if (!mc_v4mapped_words(w[0], w[1], w[2])) {
			/* an IPv6 destination's slot: 100::S */
			struct mc_slot6 *v6;

			if (ctx->type != SOCK_STREAM)
				return 1;
			v6 = mc_slot6_lookup(bpf_get_netns_cookie(ctx), w[0], w[1], w[2], w[3], bpf_ntohs(ctx->user_port));
			if (!v6)
				return 1;
			__builtin_memcpy(w, v6->addr, 16);
			ctx->user_ip6[0] = w[0];
			ctx->user_ip6[1] = w[1];
			ctx->user_ip6[2] = w[2];
			ctx->user_ip6[3] = w[3];
			ctx->user_port = bpf_htons(v6->port);
			return 1;
		}
		v = mc_slot_of_peer(ctx, w[3]);
		if (!v)
			return 1;
		__builtin_memcpy(&w[3], v->addr, 4);
		ctx->user_ip6[3] = w[3];
		ctx->user_port = bpf_htons(v->port);
		return 1;
	}
	/* a v4 destination reached through an AF_INET6 socket stays v4-mapped */
	__builtin_memcpy(w, o->addr, 16);
	ctx->user_ip6[0] = w[0];
	ctx->user_ip6[1] = w[1];
	ctx->user_ip6[2] = w[2];
	ctx->user_ip6[3] = w[3];
	ctx->user_port = bpf_htons(o->port);
	return 1;
}
