// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * sockops (at the cgroup v2 root):
 *  - TCP_CONNECT_CB on a redirected app socket: its source port is now bound,
 *    so copy the original destination connect4/6 left in the socket's own
 *    storage (kept there for the app's getpeername, peername.bpf.c) to the
 *    tuple, for the proxy.
 *  - PASSIVE_ESTABLISHED_CB on the proxy's accepted socket: claim that tuple's
 *    original destination into the socket's own storage (freed with it) for
 *    cgroup/getsockopt(SO_ORIGINAL_DST).
 *  - TCP_LISTEN_CB: the proxy's inbound listener of a meshed pod, and a
 *    wildcard listener on its outbound port, go into a free slot of
 *    mc_listen (every socket of a SO_REUSEPORT group has its own slot).
 *  - STATE_CB, on the redirected IPv6 connections to [::1] a pod counts
 *    (mc_v6spill): the count goes down when one leaves for TCP_CLOSE.
 * (The sk_msg app<->proxy splice that used to live here was removed, issue 20:
 * docs/datapath.md "Why there is no splice".)
 */
#include "mc_common.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The connection as this socket sees it. */
MC_INLINE void mc_tuple_of(struct bpf_sock_ops *s, __u64 netns, struct mc_tuple *t)
{
	t->netns = netns;
	if (s->family == AF_INET) {
		__u32 l4 = s->local_ip4, r4 = s->remote_ip4;

		/* Load them here: clang would otherwise merge these loads with the
		 * v6 branch's into one load from a computed ctx offset, which the
		 * verifier refuses ("dereference of modified ctx ptr"). */
		barrier_var(l4);
		barrier_var(r4);
		mc_v4mapped(t->laddr, l4);
		mc_v4mapped(t->raddr, r4);
	} else {
		((__u32 *)t->laddr)[0] = s->local_ip6[0];
		((__u32 *)t->laddr)[1] = s->local_ip6[1];
		((__u32 *)t->laddr)[2] = s->local_ip6[2];
		((__u32 *)t->laddr)[3] = s->local_ip6[3];
		((__u32 *)t->raddr)[0] = s->remote_ip6[0];
		((__u32 *)t->raddr)[1] = s->remote_ip6[1];
		((__u32 *)t->raddr)[2] = s->remote_ip6[2];
		((__u32 *)t->raddr)[3] = s->remote_ip6[3];
	}
	t->lport = (__u16)s->local_port;
	t->rport = (__u16)bpf_ntohl(s->remote_port);
}

MC_INLINE void mc_tuple_reverse(const struct mc_tuple *in, struct mc_tuple *out)
{
	out->netns = in->netns;
	__builtin_memcpy(out->laddr, in->raddr, 16);
	__builtin_memcpy(out->raddr, in->laddr, 16);
	out->lport = in->rport;
	out->rport = in->lport;
	out->pad = 0;
}

/*
 * Is the address (this socket's remote, or local) on loopback? Every
 * redirected connection is: connect4/6 (and those of the version before)
 * send it to 127.0.0.0/8, ::ffff:127.0.0.0/104 or ::1. So the two callbacks
 * below return at once for the node's other connections, without a map
 * lookup or a socket cookie.
 */
MC_INLINE bool mc_loopback4(__u32 a)
{
	return (a & bpf_htonl(0xff000000)) == bpf_htonl(0x7f000000);
}

/* Where this socket's remote address is: off loopback, on it, or the host's
 * own loopback address exactly (127.0.0.1, ::ffff:127.0.0.1, ::1). */
enum mc_lo { MC_LO_NONE, MC_LO_ANY, MC_LO_HOST };

MC_INLINE enum mc_lo mc_lo4(__u32 a)
{
	if (a == bpf_htonl(0x7f000001))
		return MC_LO_HOST;
	return mc_loopback4(a) ? MC_LO_ANY : MC_LO_NONE;
}

MC_INLINE enum mc_lo mc_remote_lo(struct bpf_sock_ops *s)
{
	__u32 w0, w1, w2, w3;

	if (s->family == AF_INET) {
		w3 = s->remote_ip4;
		barrier_var(w3);
		return mc_lo4(w3);
	}
	w0 = s->remote_ip6[0];
	w1 = s->remote_ip6[1];
	w2 = s->remote_ip6[2];
	w3 = s->remote_ip6[3];
	barrier_var(w3);
	if (w0 != 0 || w1 != 0)
		return MC_LO_NONE;
	if (w2 == bpf_htonl(0x0000ffff))
		return mc_lo4(w3);
	return w2 == 0 && w3 == bpf_htonl(1) ? MC_LO_HOST : MC_LO_NONE;
}

MC_INLINE bool mc_local_loopback(struct bpf_sock_ops *s)
{
	__u32 w0, w1, w2, w3;

	if (s->family == AF_INET) {
		w3 = s->local_ip4;
		barrier_var(w3);
		return mc_loopback4(w3);
	}
	w0 = s->local_ip6[0];
	w1 = s->local_ip6[1];
	w2 = s->local_ip6[2];
	w3 = s->local_ip6[3];
	barrier_var(w3);
	if (w0 != 0 || w1 != 0)
		return false;
	return w2 == bpf_htonl(0x0000ffff) ? mc_loopback4(w3) : w2 == 0 && w3 == bpf_htonl(1);
}

/*
 * A redirected IPv6 connection sent to [::1] at the outbound port, in a pod
 * that may spill to IPv6 slots (mc_v6spill): counted while it holds a port
 * of ::1's one range, until it leaves for TCP_CLOSE (mc_v6_closed). A lost
 * count only errs one way: a missed decrement spills earlier (a slot is as
 * exact, with no TIME_WAIT reuse), an entry written again counts low for as
 * long as its earlier sockets live.
 */
MC_INLINE void mc_v6_opened(struct bpf_sock_ops *s, __u64 netns, __u16 rport)
{
	struct mc_v6spill *sp = bpf_map_lookup_elem(&mc_v6spill, &netns);
	struct mc_pod *pod;

	if (!sp)
		return;
	pod = mc_pod_of(netns);
	if (!pod || rport != pod->outbound_port)
		return;
	if (bpf_sock_ops_cb_flags_set(s, s->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG) != 0)
		return;
	__sync_fetch_and_add(&sp->open, 1);
}

MC_INLINE void mc_v6_closed(struct bpf_sock_ops *s)
{
	struct mc_v6spill *sp;
	__u64 netns;

	if (s->args[1] != BPF_TCP_CLOSE || s->args[0] == BPF_TCP_CLOSE)
		return;
	netns = bpf_get_netns_cookie(s);
	sp = bpf_map_lookup_elem(&mc_v6spill, &netns);
	if (sp)
		__sync_fetch_and_add(&sp->open, -1);
}

MC_INLINE void mc_on_connect(struct bpf_sock_ops *s)
{
	struct bpf_sock *sk = s->sk;
	struct mc_tuple t = {};
	struct mc_orig *o;
	enum mc_lo lo;
	__u64 cookie;

	if (!sk)
		return;
	lo = mc_remote_lo(s);
	if (lo == MC_LO_NONE)
		return;
	/* connect4/6 left the original destination in the socket's storage
	 * (it stays there for the app's getpeername). */
	o = bpf_sk_storage_get(&mc_apporig, sk, 0, 0);
	if (o) {
		mc_tuple_of(s, o->netns, &t);
		bpf_map_update_elem(&mc_origdst, &t, o, BPF_ANY);
		if (o->family == 6 && o->kind == MC_ORIG_OUTBOUND && s->family == AF_INET6)
			mc_v6_opened(s, o->netns, t.rport);
		return;
	}
	/* A connect4/6 of the version before (in mc_sockorig by socket cookie):
	 * an upgrade replaces the programs one at a time, and connections made
	 * in between must keep their original destination. Those versions sent
	 * every redirected connection to 127.0.0.1, ::ffff:127.0.0.1 or ::1 (a
	 * build of 2026-11-24 21:43-2026-11-25 00:10 spread them over 127/8
	 * and is not covered), and only from a meshed pod. Any other loopback
	 * connection, the node's and the pods' own, returns here: the cookie
	 * (made on first use) and a lookup of a random key in the LRU cost
	 * about 0.2 µs of every connect (docs/bench-datapath.md). */
	if (lo != MC_LO_HOST || !mc_pod_of(bpf_get_netns_cookie(s)))
		return;
	cookie = bpf_get_socket_cookie(s);
	o = bpf_map_lookup_elem(&mc_sockorig, &cookie);
	if (!o)
		return;
	mc_tuple_of(s, o->netns, &t);
	bpf_map_update_elem(&mc_origdst, &t, o, BPF_ANY);
	bpf_sk_storage_get(&mc_apporig, sk, o, BPF_SK_STORAGE_GET_F_CREATE);
	bpf_map_delete_elem(&mc_sockorig, &cookie);
}

MC_INLINE void mc_on_passive(struct bpf_sock_ops *s)
{
	struct mc_tuple mine = {}, app = {};
	struct bpf_sock *sk = s->sk;
	struct mc_orig *o;
	__u64 netns;

	/* Only connections to a loopback address in a meshed pod can have been
	 * redirected. (The pod's entry costs less than the tuple's lookup,
	 * which every loopback connection of an unmeshed pod would pay.) */
	if (!sk || !mc_local_loopback(s))
		return;
	netns = bpf_get_netns_cookie(s);
	/* A slotted connection: its address names the original destination,
	 * nothing to claim (outbound.bpf.c, mc_loopback_for4). */
	if (s->family == AF_INET) {
		__u32 l4 = s->local_ip4;

		barrier_var(l4);
		if (mc_slot_lookup(netns, l4, (__u16)s->local_port))
			return;
	}
	if (!mc_pod_of(netns))
		return;
	mc_tuple_of(s, netns, &mine);
	mc_tuple_reverse(&mine, &app);
	o = bpf_map_lookup_elem(&mc_origdst, &app);
	if (o) {
		bpf_sk_storage_get(&mc_skorig, sk, o, BPF_SK_STORAGE_GET_F_CREATE);
		bpf_map_delete_elem(&mc_origdst, &app);
	}
}

/*
 * Listeners of a meshed pod that the datapath must find without a socket
 * lookup, each in a free slot of mc_listen (the sockhash drops a socket when
 * it stops listening):
 *  - the proxy's inbound listener (key port = inbound port): sk_lookup
 *    steers captured inbound connections to it;
 *  - a listener on 0.0.0.0 at the outbound port (key port = outbound port,
 *    family 4): connect4/6 then know a wildcard listener takes every 127.x
 *    address and spread redirected connections over 127.0.0.0/8 without
 *    asking the kernel's socket lookup per connect (outbound.bpf.c); one on
 *    [::] (family 6) takes IPv6 slots, 100::/64.
 */
MC_INLINE void mc_on_listen(struct bpf_sock_ops *s)
{
	__u64 netns = bpf_get_netns_cookie(s);
	struct mc_pod *pod = mc_pod_of(netns);
	struct mc_listen_key k = {};
	__u32 port = s->local_port;

	if (!pod)
		return;
	k.netns = netns;
	k.family = s->family == AF_INET ? 4 : 6;
	if (port == pod->inbound_port) {
		k.port = pod->inbound_port;
	} else if (port == pod->outbound_port && s->family == AF_INET) {
		__u32 l4 = s->local_ip4;

		if (l4 != 0)
			return;
		k.port = pod->outbound_port;
	} else if (port == pod->outbound_port) {
		/* [::]: IPv6 slots (outbound.bpf.c, mc_wildcard_listener) */
		__u32 w0 = s->local_ip6[0], w1 = s->local_ip6[1], w2 = s->local_ip6[2], w3 = s->local_ip6[3];

		barrier_var(w3);
		if ((w0 | w1 | w2 | w3) != 0)
			return;
		k.port = pod->outbound_port;
	} else {
		return;
	}
	/* The first free slot: each socket of a reuseport group gets its own, and
	 * a closed socket's slot (the sockhash drops it) is taken by the next. */
#pragma unroll
	for (int i = 0; i < MC_LISTEN_SLOTS; i++) {
		k.slot = i;
		if (bpf_sock_hash_update(s, &mc_listen, &k, BPF_NOEXIST) == 0)
			return;
	}
}

SEC("sockops")
int mc_sockops(struct bpf_sock_ops *s)
{
	switch (s->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
		mc_on_connect(s);
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		mc_on_passive(s);
		break;
	case BPF_SOCK_OPS_TCP_LISTEN_CB:
		mc_on_listen(s);
		break;
	case BPF_SOCK_OPS_STATE_CB:
		/* set only on the IPv6 connections mc_v6_opened counts */
		mc_v6_closed(s);
		break;
	}
	return 1;
}
