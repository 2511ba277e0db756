// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The app's view of a redirected socket, as iptables REDIRECT leaves it:
 * connect() was rewritten to the proxy on loopback, but getpeername() must
 * still return the original destination, not 127.0.0.1:15001. (getsockname()
 * already shows the pod's address: outbound.bpf.c binds it before the
 * rewrite.) A TCP socket's original destination is named by its peer's
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

SEC("cgroup/getpeername4")
int mc_getpeername4(struct bpf_sock_addr *ctx)
{
	struct mc_orig *o = mc_orig_of(ctx);
	struct mc_slot *v;
	__u32 a;

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
		if (w[0] != 0 || w[1] != 0 || w[2] != bpf_htonl(0x0000ffff)) {
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
