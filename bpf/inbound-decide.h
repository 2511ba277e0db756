/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The inbound capture decision of mc_inbound (inbound.bpf.c, one instance per
 * pod) and mc_inbound_main (inbound-shared.bpf.c, one per node, reached from
 * each pod's stub by a tail call): the same steps, only where the pod's netns
 * cookie comes from differs. The includer defines MC_INBOUND_NETNS() (read
 * after the loopback checks, which most connections stop at).
 */
#ifndef MC_INBOUND_DECIDE_H
#define MC_INBOUND_DECIDE_H

/* Any registered listener of the proxy: the kernel's reuseport selection
 * after bpf_sk_assign spreads connections over the socket's whole group. */
MC_INLINE struct bpf_sock *mc_listener(struct mc_listen_key *k)
{
	struct bpf_sock *sk;

#pragma unroll
	for (int i = 0; i < MC_LISTEN_SLOTS; i++) {
		k->slot = i;
		sk = bpf_map_lookup_elem(&mc_listen, k);
		if (sk)
			return sk;
	}
	return NULL;
}

/* arg_netns: the shared program's cookie from its stub (MC_INBOUND_NETNS()
 * may name it); the whole program passes 0 and reads its .bss. */
static __always_inline int mc_inbound_decide(struct bpf_sk_lookup *ctx, __u64 arg_netns)
{
	__u8 local[16], remote[16];
	struct mc_listen_key k = {};
	struct bpf_sock *sk;
	struct mc_pod *pod;
	__u64 netns;
	__u16 port;
	long err;
	bool v4;

	if (ctx->protocol != IPPROTO_TCP)
		return SK_PASS;
	/* Asked before the pod's entry (issue 19: per-connection cost); the
	 * pod's stub asks it before its tail call too. */
	if (mc_lookup_own(ctx))
		return SK_PASS;
	mc_lookup_addrs(ctx, local, remote);
	v4 = ctx->family == AF_INET;
	/* 0: no pod (a whole program not given its cookie yet; the shared
	 * program run without a stub) */
	netns = MC_INBOUND_NETNS();
	if (!netns)
		return SK_PASS;
	pod = mc_pod_of(netns);
	if (!pod || !(pod->flags & MC_F_IN_CAPTURE))
		return SK_PASS;
	if (!v4 && !(pod->flags & MC_F_IPV6))
		return SK_PASS;
	/* and the pod's own addresses */
	if (mc_is_pod_addr(pod, remote))
		return SK_PASS;
	/* An IPv6 slot (100::/64, routed to the pod's lo) from anywhere else:
	 * only the pod's own redirected connections use it, and a SYN from
	 * outside must not reach the app there around the inbound capture
	 * (under iptables the pod has no such local address). */
	if (!v4 && mc_slot6_words(((__u32 *)local)[0], ((__u32 *)local)[1], ((__u32 *)local)[2]))
		return SK_DROP;
	port = (__u16)ctx->local_port;
	if (port == pod->tunnel_port || port == pod->inbound_port)
		return SK_PASS;
	if (mc_port_in(pod, netns, port, MC_PORT_IN_EXCLUDE))
		return SK_PASS;
	if (!(pod->flags & MC_F_IN_ALL) && !mc_port_in(pod, netns, port, MC_PORT_IN_INCLUDE))
		return SK_PASS;

	k.netns = netns;
	k.port = pod->inbound_port;
	k.family = ctx->family == AF_INET ? 4 : 6;
	sk = mc_listener(&k);
	if (!sk && ctx->family == AF_INET) {
		k.family = 6; /* a dual-stack [::] listener takes v4 too */
		sk = mc_listener(&k);
	}
	/* Captured but no proxy listening: refuse rather than bypass the proxy,
	 * as a REDIRECT to a closed port would. */
	if (!sk)
		return SK_DROP;
	err = bpf_sk_assign(ctx, sk, 0);
	bpf_sk_release(sk);
	if (err)
		return SK_DROP;
	MC_STAT_INC(netns, inbound);
	return SK_PASS;
}

#endif /* MC_INBOUND_DECIDE_H */
