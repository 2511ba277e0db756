// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * DNS capture over UDP for pods that ask for it (ISTIO_META_DNS_CAPTURE):
 * sendmsg to port 53 from a non-proxy process goes to the proxy's DNS port on
 * loopback; recvmsg makes the reply appear to come from the resolver the app
 * addressed. connect() of UDP and TCP DNS sockets is handled by outbound.
 */
#include "mc_common.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

MC_INLINE struct mc_pod *mc_dns_pod(struct bpf_sock_addr *ctx, __u64 *netns, const __u8 dst[16])
{
	struct mc_pod *pod;
	__u64 ug;

	if (ctx->type != SOCK_DGRAM || bpf_ntohs(ctx->user_port) != DNS_PORT)
		return NULL;
	*netns = bpf_get_netns_cookie(ctx);
	pod = mc_pod_of(*netns);
	if (!pod || !(pod->flags & MC_F_DNS))
		return NULL;
	if (!mc_is_v4mapped(dst) && !(pod->flags & MC_F_IPV6))
		return NULL;
	ug = bpf_get_current_uid_gid();
	if ((__u32)ug == pod->proxy_uid || (__u32)(ug >> 32) == pod->proxy_gid)
		return NULL;
	if (!(pod->flags & MC_F_NO_OUT_XPORTS) && mc_port_in(pod, *netns, DNS_PORT, MC_PORT_OUT_EXCLUDE))
		return NULL;
	if (!(pod->flags & MC_F_DNS_ALL) && !mc_cidr_match(*netns, dst, MC_CIDR_DNS4))
		return NULL;
	return pod;
}

MC_INLINE void mc_remember(struct bpf_sock_addr *ctx, __u64 netns, const __u8 dst[16])
{
	struct mc_orig o = {};
	__u64 cookie = bpf_get_socket_cookie(ctx);

	__builtin_memcpy(o.addr, dst, 16);
	o.port = DNS_PORT;
	o.family = mc_is_v4mapped(dst) ? 4 : 6;
	o.kind = MC_ORIG_OUTBOUND;
	o.netns = netns;
	bpf_map_update_elem(&mc_dnsorig, &cookie, &o, BPF_ANY);
	MC_STAT_INC(netns, dns);
}

SEC("cgroup/sendmsg4")
int mc_sendmsg4(struct bpf_sock_addr *ctx)
{
	__u8 dst[16];
	__u64 netns = 0;
	struct mc_pod *pod;

	mc_v4mapped(dst, ctx->user_ip4);
	pod = mc_dns_pod(ctx, &netns, dst);
	if (!pod)
		return 1;
	mc_remember(ctx, netns, dst);
	ctx->user_ip4 = bpf_htonl(0x7f000001);
	ctx->user_port = bpf_htons(pod->dns_port);
	return 1;
}

SEC("cgroup/sendmsg6")
int mc_sendmsg6(struct bpf_sock_addr *ctx)
{
	__u8 dst[16];
	__u64 netns = 0;
	struct mc_pod *pod;

	((__u32 *)dst)[0] = ctx->user_ip6[0];
	((__u32 *)dst)[1] = ctx->user_ip6[1];
	((__u32 *)dst)[2] = ctx->user_ip6[2];
	((__u32 *)dst)[3] = ctx->user_ip6[3];
	pod = mc_dns_pod(ctx, &netns, dst);
	if (!pod)
		return 1;
	mc_remember(ctx, netns, dst);
	ctx->user_ip6[0] = 0;
	ctx->user_ip6[1] = 0;
	ctx->user_ip6[2] = mc_is_v4mapped(dst) ? bpf_htonl(0x0000ffff) : 0;
	ctx->user_ip6[3] = mc_is_v4mapped(dst) ? bpf_htonl(0x7f000001) : bpf_htonl(1);
	ctx->user_port = bpf_htons(pod->dns_port);
	return 1;
}

/* A reply from the proxy's DNS port: show the resolver the app asked. */
MC_INLINE struct mc_orig *mc_reply_orig(struct bpf_sock_addr *ctx)
{
	__u64 netns, cookie;
	struct mc_pod *pod;

	if (ctx->type != SOCK_DGRAM)
		return NULL;
	netns = bpf_get_netns_cookie(ctx);
	pod = mc_pod_of(netns);
	if (!pod || bpf_ntohs(ctx->user_port) != pod->dns_port)
		return NULL;
	cookie = bpf_get_socket_cookie(ctx);
	return bpf_map_lookup_elem(&mc_dnsorig, &cookie);
}

SEC("cgroup/recvmsg4")
int mc_recvmsg4(struct bpf_sock_addr *ctx)
{
	struct mc_orig *o;

	if (ctx->user_ip4 != bpf_htonl(0x7f000001))
		return 1;
	o = mc_reply_orig(ctx);
	if (!o || o->family != 4)
		return 1;
	__u32 ip;
	__builtin_memcpy(&ip, o->addr + 12, 4);
	ctx->user_ip4 = ip;
	ctx->user_port = bpf_htons(o->port);
	return 1;
}

SEC("cgroup/recvmsg6")
int mc_recvmsg6(struct bpf_sock_addr *ctx)
{
	struct mc_orig *o;

	/* Only replies from where sendmsg6 sent the query: ::1, or
	 * ::ffff:127.0.0.1 for a v4-mapped resolver (as recvmsg4 checks 127.0.0.1). */
	__u32 w0 = ctx->user_ip6[0], w1 = ctx->user_ip6[1], w2 = ctx->user_ip6[2], w3 = ctx->user_ip6[3];
	if (w0 != 0 || w1 != 0)
		return 1;
	if (!((w2 == 0 && w3 == bpf_htonl(1)) || (w2 == bpf_htonl(0x0000ffff) && w3 == bpf_htonl(0x7f000001))))
		return 1;
	o = mc_reply_orig(ctx);
	if (!o)
		return 1;
	ctx->user_ip6[0] = ((__u32 *)o->addr)[0];
	ctx->user_ip6[1] = ((__u32 *)o->addr)[1];
	ctx->user_ip6[2] = ((__u32 *)o->addr)[2];
	ctx->user_ip6[3] = ((__u32 *)o->addr)[3];
	ctx->user_port = bpf_htons(o->port);
	return 1;
}
