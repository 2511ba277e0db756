// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * cgroup/getsockopt at the cgroup v2 root: answer SO_ORIGINAL_DST (SOL_IP) and
 * IP6T_SO_ORIGINAL_DST (SOL_IPV6) for the proxy's accepted sockets in meshed
 * pods with the same struct an iptables REDIRECT + conntrack would give.
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

char LICENSE[] SEC("license") = "Dual BSD/GPL";

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
	netns = bpf_get_netns_cookie(ctx);
	pod = mc_pod_of(netns);
	if (!pod)
		return mc_pass(ctx);

	o = bpf_sk_storage_get(&mc_skorig, sk, 0, 0);
	if (!o) {
		/* Connections steered by sk_lookup keep their original destination
		 * as the local address (no rewriting), which is what conntrack
		 * answers for them; only the proxy gets that answer. */
		__u64 ug = bpf_get_current_uid_gid();
		if ((__u32)ug != pod->proxy_uid && (__u32)(ug >> 32) != pod->proxy_gid)
			return mc_pass(ctx);
		if (sk->protocol != IPPROTO_TCP || sk->src_port == pod->outbound_port ||
		    sk->src_port == pod->inbound_port)
			return mc_pass(ctx);
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
		sin6->flowinfo = 0;
		__builtin_memcpy(sin6->addr, o->addr, 16);
		sin6->scope_id = 0;
	}
	ctx->retval = 0;
	MC_STAT_INC(netns, origdst);
	return 1;
}
