// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * cgroup/getsockopt at the cgroup v2 root: answer SO_ORIGINAL_DST (SOL_IP) and
 * IP6T_SO_ORIGINAL_DST (SOL_IPV6) for the proxy's accepted sockets in meshed
 * pods with the same struct an iptables REDIRECT + conntrack would give:
 * from the socket's storage (sockops), from the slot its local address
 * names (mc_slotted), or for sk_lookup-steered connections its own address.
 * Every other option, and every socket outside meshed pods, is left exactly
 * as the kernel answered: for an answer over a page mc_pass() sets
 * ctx->optlen to 0, which tells the kernel (5.12+) to keep the caller's
 * buffer and length as its own getsockopt left them. Returning 1 with optlen
 * untouched is not the same:
 * before upstream 29ebbba7d461 (5.15.121, 6.1.39, 6.3) an answer longer
 * than a page (iptables-legacy's IPT_SO_GET_ENTRIES, as kube-proxy reads it;
 * SO_PEERGROUPS with many groups) then failed with EFAULT on every socket of
 * the node.
 *
 * optlen is left as the caller passed it, as getorigdst() does: the kernel's
 * buffer for this hook is zeroed, so a caller's sockaddr_storage comes back
 * with the struct followed by zeros, byte for byte what REDIRECT gives.
 */
#include "mc_common.h"
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define MC_ENOENT 2
#define MC_EINVAL 22

/*
 * Set by the loader from first-class feature probes (src/loader/features.ts,
 * OPTIONAL_FEATURES); the verifier prunes the branches they switch off, so
 * this object loads where the helpers they guard do not exist.
 *  - mc_set_retval: getsockopt programs may turn the answer into an error
 *    (bpf_set_retval's release, upstream 5.18; before it the kernel answers
 *    EFAULT for any error a program sets).
 *  - mc_read_flowlabel: bpf_probe_read_kernel is callable here, to read the
 *    proxy socket's IPv6 flow label for sin6_flowinfo.
 */
const volatile __u8 mc_set_retval = 0;
const volatile __u8 mc_read_flowlabel = 0;

struct mc_sockaddr_in {
	__u16 family;
	__u16 port; /* network order */
	__u32 addr;
	__u8 zero[8];
};

struct mc_sockaddr_in6 {
	__u16 family;
	__u16 port;
	__u32 flowinfo;
	__u8 addr[16];
	__u32 scope_id;
};

/*
 * Not ours: the answer stands as it is, whatever its length. Only an answer
 * longer than the page the kernel showed us gets optlen 0 (keep the caller's
 * buffer); a shorter one is left alone, since another program before us at
 * the root may have written it (zeroing optlen there would throw its answer
 * away: two meshcap datapaths, or another mesh's getsockopt, side by side).
 * 4096: the page of x86-64 and of arm64's default; with larger pages answers
 * between 4 KiB and a page fit the kernel's buffer and need nothing.
 */
#define MC_SOCKOPT_PAGE 4096
MC_INLINE int mc_pass(struct bpf_sockopt *ctx)
{
	if (ctx->optlen > MC_SOCKOPT_PAGE)
		ctx->optlen = 0;
	return 1;
}

/*
 * No original destination for this socket of a meshed pod: answer what
 * getorigdst() answers when conntrack has no entry — EINVAL for a buffer
 * shorter than the struct, ENOENT otherwise, for TCP (other protocols keep
 * the kernel's ENOPROTOOPT, as conntrack gives). Where nf_conntrack is loaded
 * the kernel has answered that already; without it the kernel said
 * ENOPROTOOPT for everything. An answer another program made (retval 0)
 * stands.
 */
MC_INLINE int mc_no_origdst(struct bpf_sockopt *ctx, struct bpf_sock *sk)
{
	if (mc_set_retval && ctx->retval != 0 && sk->protocol == IPPROTO_TCP) {
		int need = ctx->level == SOL_IP ? 16 : 28;
		ctx->retval = ctx->optlen < need ? -MC_EINVAL : -MC_ENOENT;
	}
	return mc_pass(ctx);
}

/* ipv6_iface_scope_id(): the socket's bound device for a link-local (or
 * link/interface-local multicast) destination, else 0. */
MC_INLINE __u32 mc_scope_id(const __u8 a[16], __u32 bound_dev_if)
{
	if (a[0] == 0xfe && (a[1] & 0xc0) == 0x80)
		return bound_dev_if;
	if (a[0] == 0xff && ((a[1] & 0x0f) == 0x1 || (a[1] & 0x0f) == 0x2))
		return bound_dev_if;
	return 0;
}

/* The socket's own flow label (np->flow_label & IPV6_FLOWINFO_MASK), what
 * ipv6_getorigdst() puts in sin6_flowinfo: 0 unless flow label reflection
 * (net.ipv6.flowlabel_reflect) or a flow label manager set one. */
MC_INLINE __u32 mc_flowinfo(struct bpf_sock *sk)
{
	volatile __u64 slot;
	struct inet_sock *inet = 0;
	struct ipv6_pinfo *np;
	__u32 fl = 0;

	if (!mc_read_flowlabel)
		return 0;
	/* The verifier forbids arithmetic on a socket pointer; read its value
	 * back through the stack as a plain number (the loader runs with
	 * CAP_BPF + CAP_PERFMON), then read the fields fault-safe with CO-RE. */
	slot = (__u64)(unsigned long)sk;
	bpf_probe_read_kernel(&inet, sizeof(inet), (const void *)&slot);
	if (!inet)
		return 0;
	np = BPF_CORE_READ(inet, pinet6);
	if (!np)
		return 0;
	fl = BPF_CORE_READ(np, flow_label);
	return fl & bpf_htonl(0x0fffffff);
}

/*
 * A slotted connection (outbound.bpf.c, mc_loopback_for4): the proxy's
 * socket's own local address, 127.S at the outbound port, names the
 * original destination in the pod's mc_dstslot (100::S: mc_dstslot6). Only connected TCP sockets
 * (a listener bound to 127.S has no conntrack entry under iptables either).
 */
MC_INLINE bool mc_slotted(struct bpf_sock *sk, __u64 netns, struct mc_orig *out)
{
	struct mc_slot *v;
	__u32 a;

	if (sk->protocol != IPPROTO_TCP || sk->dst_port == 0)
		return false;
	/* Each field loaded on its own (barrier_var): clang would otherwise
	 * merge the two branches' loads into one from a computed offset, which
	 * the verifier refuses ("pointer arithmetic on sock prohibited"). */
	if (sk->family == AF_INET) {
		a = sk->src_ip4;
		barrier_var(a);
	} else {
		/* a dual-stack listener's socket of an IPv4 connection */
		__u32 w0 = sk->src_ip6[0], w1 = sk->src_ip6[1], w2 = sk->src_ip6[2];

		barrier_var(w0);
		barrier_var(w1);
		barrier_var(w2);
		if (w0 != 0 || w1 != 0 || w2 != bpf_htonl(0x0000ffff)) {
			/* an IPv6 slot, 100::S (outbound.bpf.c, mc_slotted_addr6),
			 * answered only for a connection from one of the pod's own
			 * addresses: 100::/64 is not refused from outside as
			 * loopback is, and a peer elsewhere must not learn, or be
			 * forwarded to, the pod's destination */
			struct mc_slot6 *v6;
			struct mc_pod *pod;
			__u8 peer[16];
			__u32 w3 = sk->src_ip6[3];

			barrier_var(w3);
			v6 = mc_slot6_lookup(netns, w0, w1, w2, w3, (__u16)sk->src_port);
			if (!v6)
				return false;
			((__u32 *)peer)[0] = sk->dst_ip6[0];
			((__u32 *)peer)[1] = sk->dst_ip6[1];
			((__u32 *)peer)[2] = sk->dst_ip6[2];
			((__u32 *)peer)[3] = sk->dst_ip6[3];
			pod = mc_pod_of(netns);
			if (!pod || !mc_is_pod_addr(pod, peer))
				return false;
			__builtin_memcpy(out->addr, v6->addr, 16);
			out->port = v6->port;
			out->family = 6;
			out->kind = MC_ORIG_OUTBOUND;
			out->netns = netns;
			return true;
		}
		a = sk->src_ip6[3];
		barrier_var(a);
	}
	v = mc_slot_lookup(netns, a, (__u16)sk->src_port);
	if (!v)
		return false;
	__builtin_memcpy(&a, v->addr, 4);
	mc_v4mapped(out->addr, a);
	out->port = v->port;
	out->family = 4;
	out->kind = MC_ORIG_OUTBOUND;
	out->netns = netns;
	return true;
}

SEC("cgroup/getsockopt")
int mc_getsockopt(struct bpf_sockopt *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	struct mc_orig local = {};
	struct mc_orig *o;
	struct mc_pod *pod;
	__u64 netns;

	if (ctx->optname != SO_ORIGINAL_DST || (ctx->level != SOL_IP && ctx->level != SOL_IPV6))
		return mc_pass(ctx);
	if (!sk)
		return mc_pass(ctx);

	/* A socket sockops gave an original destination keeps it for its whole
	 * life, as conntrack keeps answering for a connection after the rules
	 * are gone: answered without the pod's entry (its netns is in it). */
	o = bpf_sk_storage_get(&mc_skorig, sk, 0, 0);
	if (o) {
		netns = o->netns;
	} else {
		netns = bpf_get_netns_cookie(ctx);
		if (mc_slotted(sk, netns, &local))
			o = &local;
	}
	if (!o) {
		pod = mc_pod_of(netns);
		if (!pod)
			return mc_pass(ctx);
		/* Connections steered by sk_lookup keep their original destination
		 * as the local address (no rewriting), which is what conntrack
		 * answers for them; only the proxy gets that answer, and only for
		 * a connected socket: a listening or unconnected one has no
		 * conntrack entry (ENOENT under iptables). */
		__u64 ug = bpf_get_current_uid_gid();
		if ((__u32)ug != pod->proxy_uid && (__u32)(ug >> 32) != pod->proxy_gid)
			return mc_no_origdst(ctx, sk);
		if (sk->protocol != IPPROTO_TCP || sk->dst_port == 0)
			return mc_no_origdst(ctx, sk);
		if (sk->family == AF_INET) {
			mc_v4mapped(local.addr, sk->src_ip4);
		} else {
			((__u32 *)local.addr)[0] = sk->src_ip6[0];
			((__u32 *)local.addr)[1] = sk->src_ip6[1];
			((__u32 *)local.addr)[2] = sk->src_ip6[2];
			((__u32 *)local.addr)[3] = sk->src_ip6[3];
		}
		local.port = (__u16)sk->src_port;
		local.family = mc_is_v4mapped(local.addr) ? 4 : 6;
		/* conntrack answers only where it runs: for IPv6 only in a pod
		 * whose IPv6 is captured (without dual stack Istio writes no
		 * ip6tables rules, and nothing tracks IPv6 in the pod's netns). */
		if (local.family == 6 && !(pod->flags & MC_F_IPV6))
			return mc_no_origdst(ctx, sk);
		/* The proxy's own ports on a loopback address are where connect4/6
		 * send redirected connections: one that got no answer above lost
		 * its original destination, and answering the proxy with itself
		 * would loop it. On the pod's address the connection came from
		 * outside, and conntrack answers its own address whether REDIRECT
		 * moved it (inbound capture of 15001: sk_lookup steered it to the
		 * inbound listener, address kept) or not (15006 reached directly). */
		if ((local.port == pod->outbound_port || local.port == pod->inbound_port) && mc_is_loopback(local.addr))
			return mc_no_origdst(ctx, sk);
		/* An IPv6 slot's address not answered above (a peer other than the
		 * pod's own: mc_slotted) has no destination to give: the pod has
		 * no such address under iptables. */
		if (local.family == 6 && mc_slot6_words(((__u32 *)local.addr)[0], ((__u32 *)local.addr)[1], ((__u32 *)local.addr)[2]))
			return mc_no_origdst(ctx, sk);
		o = &local;
	}

	if (ctx->level == SOL_IP) {
		struct mc_sockaddr_in *sin = ctx->optval;
		if (o->family != 4 || (void *)(sin + 1) > ctx->optval_end)
			return mc_pass(ctx);
		sin->family = AF_INET;
		sin->port = bpf_htons(o->port);
		__builtin_memcpy(&sin->addr, o->addr + 12, 4);
		__builtin_memset(sin->zero, 0, 8);
	} else {
		struct mc_sockaddr_in6 *sin6 = ctx->optval;
		if (o->family != 6 || (void *)(sin6 + 1) > ctx->optval_end)
			return mc_pass(ctx);
		sin6->family = AF_INET6;
		sin6->port = bpf_htons(o->port);
		sin6->flowinfo = mc_flowinfo(sk);
		__builtin_memcpy(sin6->addr, o->addr, 16);
		sin6->scope_id = mc_scope_id(o->addr, sk->bound_dev_if);
	}
	ctx->retval = 0;
	MC_STAT_INC(netns, origdst);
	return 1;
}
