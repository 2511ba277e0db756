// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Outbound capture: cgroup/connect4 and cgroup/connect6, attached once at the
 * cgroup v2 root. For sockets of meshed pods (keyed by netns cookie) the
 * destination is rewritten to the proxy on loopback, following istio-iptables'
 * ISTIO_OUTPUT chain rule for rule (see mc_decide), and the original
 * destination is named by the loopback address (mc_loopback_for4) or kept in
 * the socket's storage for sockops to hand over.
 */
#include "mc_common.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/*
 * Set by the loader where peername.bpf.o's programs are attached in the same
 * load (src/loader/manifest.ts): then an unbound IPv4 socket sent to a slot
 * is not bound to the pod's address (mc_connect4). Its connection runs
 * 127.0.0.1 -> 127.S, and the views say what REDIRECT's would: the app's
 * getsockname() and the proxy's accept()/getpeername() give the pod's
 * address (peername.bpf.c). On the wire it saves what the pod's address
 * costs: bpf_bind, and a route the kernel allocates and frees for each
 * SYN-ACK and accepted socket, since a local route of the pod's interface
 * is never cached for output over lo (docs/bench-datapath.md).
 */
const volatile __u8 mc_src_view = 0;

/* An IPv4 connection sent to lo (network order) gets the pod's address from
 * the views, not a bind: lo is a slot, which names the connection on both
 * ends (127.0.0.1:15001 names nothing), and the views are attached. */
MC_INLINE bool mc_src_in_views(__u32 lo)
{
	return mc_src_view && lo != bpf_htonl(0x7f000001);
}

enum mc_verdict { MC_PASS, MC_TO_OUTBOUND, MC_TO_INBOUND, MC_TO_DNS };

MC_INLINE bool mc_is_host_loopback(const __u8 a[16])
{
	/* ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR default 127.0.0.1/32; ::1/128 for v6 */
	const __u32 *w = (const __u32 *)a;
	if (mc_is_unspecified(a))
		return true;
	if (mc_is_v4mapped(a))
		return w[3] == bpf_htonl(0x7f000001);
	return w[0] == 0 && w[1] == 0 && w[2] == 0 && w[3] == bpf_htonl(1);
}

MC_INLINE bool mc_is_passthrough_src(const __u8 a[16])
{
	/* Envoy's inbound passthrough binds 127.0.0.6 (::6 for v6). */
	const __u32 *w = (const __u32 *)a;
	if (mc_is_v4mapped(a))
		return w[3] == bpf_htonl(0x7f000006);
	return mc_is_passthrough6(a);
}

/*
 * The ISTIO_OUTPUT chain as a function. "-o lo" (the packet would leave via
 * loopback) is: the destination is a loopback address or one of the pod's own
 * addresses, which the agent registers with the pod.
 */
MC_INLINE enum mc_verdict mc_decide(__u64 netns, const struct mc_pod *pod, const __u8 dst[16],
				    const __u8 src[16], __u16 dport, bool tcp)
{
	bool v4 = mc_is_v4mapped(dst);
	bool dns = (pod->flags & MC_F_DNS) && dport == DNS_PORT;
	bool local = mc_is_loopback(dst) || mc_is_pod_addr(pod, dst);
	__u64 ug = bpf_get_current_uid_gid();
	__u32 uid = (__u32)ug, gid = (__u32)(ug >> 32);

	if (!v4 && !(pod->flags & MC_F_IPV6))
		return MC_PASS;
	/* -p tcp/udp --dport <excludeOutboundPorts> -j RETURN */
	if (!(pod->flags & MC_F_NO_OUT_XPORTS) && mc_port_in(pod, netns, dport, MC_PORT_OUT_EXCLUDE))
		return MC_PASS;
	/* -o lo -s 127.0.0.6/32 -j RETURN */
	if (local && mc_is_passthrough_src(src))
		return MC_PASS;

	if (!tcp) {
		/* Only DNS is captured over UDP; the proxy's own lookups are not. */
		if (uid == pod->proxy_uid || gid == pod->proxy_gid || !dns)
			return MC_PASS;
		if ((pod->flags & MC_F_DNS_ALL) || mc_cidr_match(netns, dst, MC_CIDR_DNS4))
			return MC_TO_DNS;
		return MC_PASS;
	}

	/* -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 [! 53] --uid-owner P -j ISTIO_IN_REDIRECT
	 * -o lo [-p tcp ! --dport 53] ! --uid-owner P -j RETURN
	 * --uid-owner P -j RETURN   (then the same three for --gid-owner) */
	if (uid == pod->proxy_uid) {
		if (local && !mc_is_host_loopback(dst) && dport != pod->tunnel_port && !dns)
			return MC_TO_INBOUND;
		return MC_PASS;
	}
	if (local && !dns)
		return MC_PASS;
	if (gid == pod->proxy_gid) {
		if (local && !mc_is_host_loopback(dst) && dport != pod->tunnel_port)
			return MC_TO_INBOUND;
		return MC_PASS;
	}
	/* -j ISTIO_OUTPUT_DNS: -p tcp --dport 53 [-d server] -j REDIRECT --to-ports 15053 */
	if (dns && ((pod->flags & MC_F_DNS_ALL) || mc_cidr_match(netns, dst, MC_CIDR_DNS4)))
		return MC_TO_DNS;
	/* -d 127.0.0.1/32 -j RETURN */
	if (mc_is_host_loopback(dst))
		return MC_PASS;
	/* -d <excludeOutboundIPRanges> -j RETURN (before any include) */
	if (!(pod->flags & MC_F_NO_OUT_XCIDRS) && mc_cidr_match(netns, dst, MC_CIDR_OUT_EXCLUDE4))
		return MC_PASS;
	/* -p tcp --dport <includeOutboundPorts> -j ISTIO_REDIRECT */
	if (!(pod->flags & MC_F_NO_OUT_IPORTS) && mc_port_in(pod, netns, dport, MC_PORT_OUT_INCLUDE))
		return MC_TO_OUTBOUND;
	/* -j ISTIO_REDIRECT ('*') or -d <includeOutboundIPRanges> -j ISTIO_REDIRECT */
	if (pod->flags & (v4 ? MC_F_OUT_ALL4 : MC_F_OUT_ALL6))
		return MC_TO_OUTBOUND;
	if (mc_cidr_match(netns, dst, MC_CIDR_OUT_INCLUDE4))
		return MC_TO_OUTBOUND;
	return MC_PASS;
}

/* The original destination in the socket's own storage (created here). */
MC_INLINE void mc_keep_orig(struct bpf_sock *sk, const struct mc_orig *orig)
{
	struct mc_orig *so = bpf_sk_storage_get(&mc_apporig, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);

	if (so)
		*so = *orig;
}

/*
 * Drop what an earlier connect() of this socket left in its storage. Looked
 * up first: bpf_sk_storage_delete takes and puts a socket reference (two
 * atomics) even when there is nothing to delete, which is every socket but
 * a retried one.
 */
MC_INLINE void mc_drop_orig(struct bpf_sock *sk)
{
	if (bpf_sk_storage_get(&mc_apporig, sk, 0, 0))
		bpf_sk_storage_delete(&mc_apporig, sk);
}

/*
 * Decide, remember the original destination, and return the new port (0:
 * untouched). *slotted: a TCP connection to the outbound port, whose
 * original destination the caller names by a slot (IPv4: mc_loopback_for4;
 * IPv6: mc_slotted_addr6, past the pod's threshold) and keeps in the
 * socket's storage (mc_keep_orig) where it has none; orig is filled for it.
 */
MC_INLINE __u16 mc_connect(struct bpf_sock_addr *ctx, struct bpf_sock *sk, __u64 netns, const __u8 dst[16],
			   const __u8 src[16], __u16 dport, bool tcp, struct mc_pod **podp,
			   struct mc_orig *origp, bool *slotted)
{
	struct mc_pod *pod = mc_pod_of(netns);
	struct mc_orig orig = {};
	__u64 cookie = 0;
	__u16 to;

	*podp = pod;
	if (!pod)
		return 0;
	/* only UDP keys by socket cookie: not asked for sockets outside pods */
	if (!tcp)
		cookie = bpf_get_socket_cookie(ctx);
	switch (mc_decide(netns, pod, dst, src, dport, tcp)) {
	case MC_TO_OUTBOUND:
		to = pod->outbound_port;
		orig.kind = MC_ORIG_OUTBOUND;
		MC_STAT_INC(netns, outbound);
		break;
	case MC_TO_INBOUND:
		to = pod->inbound_port;
		orig.kind = MC_ORIG_OWN_POD;
		MC_STAT_INC(netns, own_pod);
		break;
	case MC_TO_DNS:
		to = pod->dns_port;
		orig.kind = MC_ORIG_OUTBOUND;
		MC_STAT_INC(netns, dns);
		break;
	default:
		/* Not redirected: forget what an earlier connect() of this socket
		 * (a failed TCP connect retried elsewhere, a UDP socket connected
		 * again) left, so nothing stale answers for the new destination. */
		if (tcp)
			mc_drop_orig(sk);
		else
			bpf_map_delete_elem(&mc_dnsorig, &cookie);
		return 0;
	}
	__builtin_memcpy(orig.addr, dst, 16);
	orig.port = dport;
	orig.family = mc_is_v4mapped(dst) ? 4 : 6;
	orig.netns = netns;
	/* TCP: in the socket's own storage (the app's getpeername, peername.bpf.c),
	 * from where sockops copies it to the connection's tuple once the source
	 * port is bound (TCP_CONNECT_CB). Written here rather than through the
	 * mc_sockorig LRU keyed by socket cookie: one allocation the socket needs
	 * anyway instead of an LRU update, lookup and delete per connection.
	 * UDP DNS: recvmsg restores the resolver as the reply source. */
	if (tcp && orig.kind == MC_ORIG_OUTBOUND && to == pod->outbound_port) {
		*origp = orig;
		*slotted = true;
	} else if (tcp) {
		mc_keep_orig(sk, &orig);
	} else {
		bpf_map_update_elem(&mc_dnsorig, &cookie, &orig, BPF_ANY);
	}
	return to;
}

/*
 * Source address as under REDIRECT: routing picked the pod's address for the
 * original destination before NAT, so the app's getsockname() and the proxy's
 * peer are the pod's address. Binding it before the rewrite to loopback keeps
 * that (port 0: the port is picked at connect, as IP_BIND_ADDRESS_NO_PORT).
 * Only for a socket with no local address yet (the callers check): under
 * REDIRECT a socket the app bound keeps its address, and bpf_bind would not
 * refuse one bound with IP_BIND_ADDRESS_NO_PORT (no port yet, so __inet_bind
 * takes it as unbound) but replace the app's address with the pod's first.
 * (A socket bound with a port is refused, EINVAL, either way.) An IPv4
 * connection sent to a slot gets the pod's address from the views instead
 * where they are attached (mc_src_view).
 */
MC_INLINE void mc_bind_pod4(struct bpf_sock_addr *ctx, const struct mc_pod *pod)
{
	struct sockaddr_in sa = {};

	if (pod->n_addr4 == 0)
		return;
	sa.sin_family = AF_INET;
	__builtin_memcpy(&sa.sin_addr.s_addr, pod->addr4[0], 4);
	bpf_bind(ctx, (struct sockaddr *)&sa, sizeof(sa));
}

MC_INLINE void mc_bind_pod6(struct bpf_sock_addr *ctx, const struct mc_pod *pod, bool v4mapped)
{
	struct sockaddr_in6 sa = {};
	__u32 *w = (__u32 *)&sa.sin6_addr;

	sa.sin6_family = AF_INET6;
	if (v4mapped) {
		if (pod->n_addr4 == 0)
			return;
		w[2] = bpf_htonl(0x0000ffff);
		__builtin_memcpy(&w[3], pod->addr4[0], 4);
	} else {
		if (pod->n_addr6 == 0)
			return;
		__builtin_memcpy(w, pod->addr6[0], 16);
	}
	bpf_bind(ctx, (struct sockaddr *)&sa, sizeof(sa));
}

/*
 * Which loopback address a redirected IPv4 connection is sent to, and how
 * the proxy learns its original destination.
 *
 * Every socket of a pod sent to 127.0.0.1:15001 would share one 4-tuple
 * space (pod address, port, 127.0.0.1, 15001), so the pod's concurrent
 * outbound connections would share one ephemeral port range, where under
 * iptables the app's socket keeps its original destination and gets a range
 * per destination (docs/bench-capacity.md). So each original destination
 * (address and port) of a pod gets its own address in 127.0.0.0/8: its
 * slot, kept in mc_dstslot for the pod's life. The address then names the
 * destination: the proxy's SO_ORIGINAL_DST (origdst.bpf.c) and the app's
 * getpeername() (peername.bpf.c) look the connection's own loopback address
 * up, and nothing is allocated, carried or freed per connection (a socket
 * storage on each side and a tuple-keyed entry in between, before slots:
 * most of eBPF mode's per-connection cost, docs/bench-datapath.md).
 *
 * Slots are only for a listener that takes every 127.x address (the proxy
 * bound to the wildcard, as Envoy binds 0.0.0.0:15001); a proxy bound to
 * 127.0.0.1 only (linkerd2-proxy: 127.0.0.1:4140) gets 127.0.0.1, and so
 * does a connection that finds no slot (the map full, or every probe taken
 * by other destinations): those keep their original destination in the
 * sockets' storage as before. Loopback either way, so tcp_tw_reuse=2 (the
 * default) still applies to the app's TIME_WAIT.
 *
 * The slot is a hash of destination and port (probe 0 is the address the
 * version before picked for it), probed MC_SLOT_PROBES times.
 * src/explain/kernel-verdict.ts computes the same (slotHash4).
 */
/* The probe's mix of a destination's hash input (both families). */
MC_INLINE __u32 mc_slot_mix(__u32 x, __u32 probe)
{
	x += probe * 0x632be5ab;
	x *= 0x9e3779b1;
	x ^= x >> 15;
	x *= 0x85ebca77;
	x ^= x >> 13;
	return x;
}

MC_INLINE __u32 mc_slot_hash4(__u32 ip_be, __u16 dport, __u32 probe)
{
	return mc_slot_mix(bpf_ntohl(ip_be) ^ ((__u32)dport << 16 | dport), probe) & 0x00ffffff;
}

#define MC_EEXIST 17

/*
 * The pod's slot for (destination, port) sent to `to`: the one it has, or a
 * free one claimed now; 0 when the first `probes` candidates are other
 * destinations' or the map is full. A slot is written once, before any
 * connection is sent to its address, and removed only with its pod, so a
 * reader that finds it sees what it will always say.
 */
MC_INLINE __u32 mc_slot_claim4(__u64 netns, __u32 ip_be, __u16 dport, __u16 to, int probes)
{
	struct mc_slot_key k = {};
	struct mc_slot want = {}, *v;

	k.netns = netns;
	__builtin_memcpy(want.addr, &ip_be, 4);
	want.port = dport;
	want.to = to;
	/* a bounded loop (5.3+ verifiers; eBPF mode needs 5.15) */
	for (int i = 0; i < MC_SLOT_PROBES; i++) {
		long err;
		__u32 a;

		if (i >= probes)
			break;
		k.slot = mc_slot_hash4(ip_be, dport, i);
		if (!mc_slot_of4(bpf_htonl(0x7f000000 | k.slot)))
			continue;
		v = bpf_map_lookup_elem(&mc_dstslot, &k);
		if (!v) {
			err = bpf_map_update_elem(&mc_dstslot, &k, &want, BPF_NOEXIST);
			if (err == 0)
				return k.slot;
			if (err != -MC_EEXIST)
				return 0; /* full */
			/* another CPU claimed it first, perhaps for this destination */
			v = bpf_map_lookup_elem(&mc_dstslot, &k);
			if (!v)
				continue;
		}
		__builtin_memcpy(&a, v->addr, 4);
		if (a == ip_be && v->port == dport && v->to == to)
			return k.slot;
	}
	return 0;
}

/*
 * Does a listener take any 127.x address on the outbound port (family 4), or
 * any 100::/64 address (family 6)? sockops puts the pod's listener on the
 * outbound port into mc_listen (key port = outbound port, family 4 or 6)
 * only when it listens on 0.0.0.0 or [::], and the sockhash
 * drops it when it stops listening (close, shutdown); the socket's own
 * fields are checked again here. No entry is not an answer (the proxy may listen
 * on [::] dual-stack for IPv4, whose v6only sockops cannot read, or it listened before
 * the programs were attached and the agent has not put it back yet): then
 * the kernel's own socket lookup decides, as it always did.
 */
MC_INLINE bool mc_wildcard_listener(__u64 netns, const struct mc_pod *pod, __u8 family)
{
	struct mc_listen_key k = {};
	struct bpf_sock *sk;

	if (pod->outbound_port == pod->inbound_port)
		return false;
	k.netns = netns;
	k.port = pod->outbound_port;
	k.family = family;
#pragma unroll
	for (int i = 0; i < MC_LISTEN_SLOTS; i++) {
		__u32 w0, w1, w2, w3;
		bool any;

		k.slot = i;
		sk = bpf_map_lookup_elem(&mc_listen, &k);
		if (!sk)
			continue;
		/* Still what sockops registered, read from the socket itself now:
		 * listening on the wildcard address at the port and not bound to a
		 * device (SO_BINDTODEVICE, which a listener may set after listen():
		 * such a listener does not take connections over lo). Each word
		 * loaded on its own (see mc_slotted in origdst.bpf.c). */
		if (family == 4) {
			w0 = sk->src_ip4;
			barrier_var(w0);
			w1 = w2 = w3 = 0;
		} else {
			w0 = sk->src_ip6[0];
			w1 = sk->src_ip6[1];
			w2 = sk->src_ip6[2];
			w3 = sk->src_ip6[3];
			barrier_var(w3);
		}
		any = sk->state == BPF_TCP_LISTEN && (w0 | w1 | w2 | w3) == 0 && sk->bound_dev_if == 0 &&
		      sk->src_port == pod->outbound_port;
		bpf_sk_release(sk);
		if (any)
			return true;
	}
	return false;
}

/* The loopback address for a redirected IPv4 connection (network order): its
 * destination's slot address, or 127.0.0.1 where it gets none. */
MC_INLINE __u32 mc_loopback_for4(void *ctx, __u64 netns, const struct mc_pod *pod, const __u8 dst[16], __u16 dport, __u16 to)
{
	__u32 ip, slot;
	int probes = MC_SLOT_PROBES;

	__builtin_memcpy(&ip, dst + 12, 4);
	if (!mc_wildcard_listener(netns, pod, 4)) {
		/* Not registered: the kernel's socket lookup says whether a
		 * listener takes the first candidate (then only that one is tried). */
		struct bpf_sock_tuple t = {};
		struct bpf_sock *sk;
		__u32 x = mc_slot_hash4(ip, dport, 0);

		if (!mc_slot_of4(bpf_htonl(0x7f000000 | x)))
			return bpf_htonl(0x7f000001);
		if (pod->n_addr4)
			__builtin_memcpy(&t.ipv4.saddr, pod->addr4[0], 4);
		t.ipv4.daddr = bpf_htonl(0x7f000000 | x);
		t.ipv4.dport = bpf_htons(to);
		sk = bpf_sk_lookup_tcp(ctx, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
		if (!sk)
			return bpf_htonl(0x7f000001);
		bpf_sk_release(sk);
		probes = 1;
	}
	slot = mc_slot_claim4(netns, ip, dport, to, probes);
	return slot ? bpf_htonl(0x7f000000 | slot) : bpf_htonl(0x7f000001);
}

/*
 * Where a slotted connection goes: its slot's address, with nothing in the
 * socket's storage (one an earlier connect() of the socket left is dropped,
 * so nothing stale answers); or 127.0.0.1 with its original destination in
 * the storage.
 */
MC_INLINE __u32 mc_slotted_addr4(void *ctx, struct bpf_sock *sk, __u64 netns, const struct mc_pod *pod,
				 const __u8 dst[16], __u16 dport, __u16 to, const struct mc_orig *orig)
{
	__u32 a = mc_loopback_for4(ctx, netns, pod, dst, dport, to);

	if (a == bpf_htonl(0x7f000001))
		mc_keep_orig(sk, orig);
	else
		mc_drop_orig(sk);
	return a;
}

/*
 * IPv6 destination slots (meshcap.h): [::1] first, which keeps the reuse of
 * the app's TIME_WAIT ports; a slot address in 100::/64 once the pod has
 * mc_v6spill.at redirected IPv6 connections open there, so ::1's one port
 * range is never where a pod runs out before it would under iptables. The
 * hash is mc_slot_hash4's mix over the four words (src/explain/kernel-verdict.ts
 * computes the same, slotCandidates6); a slot is never 0.
 */
MC_INLINE __u32 mc_slot_hash6(const __u32 w[4], __u16 dport, __u32 probe)
{
	__u32 x = mc_slot_mix(bpf_ntohl(w[0]) ^ (bpf_ntohl(w[1]) * 0x85ebca77) ^ (bpf_ntohl(w[2]) * 0xc2b2ae35) ^
				  bpf_ntohl(w[3]) ^ ((__u32)dport << 16 | dport), probe);

	return x ? x : 1;
}

/* mc_slot_claim4 for IPv6: the pod's slot for (destination, port) sent to
 * `to`, claimed now if free; 0 when every probe is another destination's or
 * the map is full. */
MC_INLINE __u32 mc_slot_claim6(__u64 netns, const __u32 w[4], __u16 dport, __u16 to)
{
	struct mc_slot_key k = {};
	struct mc_slot6 want = {}, *v;

	k.netns = netns;
	__builtin_memcpy(want.addr, w, 16);
	want.port = dport;
	want.to = to;
	for (int i = 0; i < MC_SLOT_PROBES; i++) {
		long err;

		k.slot = mc_slot_hash6(w, dport, i);
		v = bpf_map_lookup_elem(&mc_dstslot6, &k);
		if (!v) {
			err = bpf_map_update_elem(&mc_dstslot6, &k, &want, BPF_NOEXIST);
			if (err == 0)
				return k.slot;
			if (err != -MC_EEXIST)
				return 0; /* full */
			v = bpf_map_lookup_elem(&mc_dstslot6, &k);
			if (!v)
				continue;
		}
		const __u32 *a = (const __u32 *)v->addr;

		if (a[0] == w[0] && a[1] == w[1] && a[2] == w[2] && a[3] == w[3] && v->port == dport && v->to == to)
			return k.slot;
	}
	return 0;
}

/* Not registered (a listener from before the maps were recreated): the
 * kernel's socket lookup says whether a listener takes a 100::/64 address. */
MC_INLINE bool mc_lookup_listener6(void *ctx, const struct mc_pod *pod, __u16 to)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;

	if (pod->n_addr6)
		__builtin_memcpy(t.ipv6.saddr, pod->addr6[0], 16);
	t.ipv6.daddr[0] = bpf_htonl(MC_SLOT6_W0);
	t.ipv6.daddr[3] = bpf_htonl(1);
	t.ipv6.dport = bpf_htons(to);
	sk = bpf_sk_lookup_tcp(ctx, &t, sizeof(t.ipv6), BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return false;
	bpf_sk_release(sk);
	return true;
}

MC_INLINE __u32 mc_slotted_addr6(void *ctx, struct bpf_sock *sk, __u64 netns, const struct mc_pod *pod, const __u8 dst[16],
				 const __u8 src[16], __u16 dport, __u16 to, const struct mc_orig *orig)
{
	struct mc_v6spill *sp = bpf_map_lookup_elem(&mc_v6spill, &netns);
	__u32 slot;

	if (!sp || sp->open < sp->at)
		goto loopback;
	/* from the pod's own address (bound by mc_bind_pod6, or by the app): the
	 * only peer the inbound program and getsockopt accept on a slot */
	if (!(mc_is_unspecified(src) ? pod->n_addr6 > 0 : mc_is_pod_addr(pod, src)))
		goto loopback;
	if (mc_wildcard_listener(netns, pod, 6) || mc_lookup_listener6(ctx, pod, to)) {
		slot = mc_slot_claim6(netns, (const __u32 *)dst, dport, to);
		if (slot) {
			mc_drop_orig(sk);
			return bpf_htonl(slot);
		}
	}
loopback:
	mc_keep_orig(sk, orig);
	return 0;
}

MC_INLINE bool mc_proto_ok(struct bpf_sock_addr *ctx, bool *tcp)
{
	*tcp = ctx->type == SOCK_STREAM && ctx->protocol == IPPROTO_TCP;
	return *tcp || (ctx->type == SOCK_DGRAM && ctx->protocol == IPPROTO_UDP);
}

SEC("cgroup/connect4")
int mc_connect4(struct bpf_sock_addr *ctx)
{
	struct mc_pod *pod;
	struct mc_orig orig = {};
	__u8 dst[16], src[16];
	struct bpf_sock *sk = ctx->sk;
	__u64 netns;
	bool tcp, slotted = false;
	__u16 to;

	if (!sk || !mc_proto_ok(ctx, &tcp))
		return 1;
	mc_v4mapped(dst, ctx->user_ip4);
	mc_v4mapped(src, sk->src_ip4);
	netns = bpf_get_netns_cookie(ctx);
	to = mc_connect(ctx, sk, netns, dst, src, bpf_ntohs(ctx->user_port), tcp, &pod, &orig, &slotted);
	if (to && pod) {
		__u32 a = slotted ? mc_slotted_addr4(ctx, sk, netns, pod, dst, orig.port, to, &orig) : bpf_htonl(0x7f000001);

		/* else the socket is left to routing, which picks 127.0.0.1 */
		if (mc_is_unspecified(src) && !mc_src_in_views(a))
			mc_bind_pod4(ctx, pod);
		ctx->user_ip4 = a;
		ctx->user_port = bpf_htons(to);
	}
	return 1;
}

SEC("cgroup/connect6")
int mc_connect6(struct bpf_sock_addr *ctx)
{
	struct mc_pod *pod;
	struct mc_orig orig = {};
	__u8 dst[16], src[16];
	struct bpf_sock *sk = ctx->sk;
	__u64 netns;
	bool tcp, slotted = false;
	__u16 to;

	if (!sk || !mc_proto_ok(ctx, &tcp))
		return 1;
	/* One 4-byte load per word, straight from the ctx field: no memcpy, and no
	 * helper macro either (clang then forms a pointer into the sock, which the
	 * verifier refuses). The same pattern recurs in the other objects. */
	((__u32 *)dst)[0] = ctx->user_ip6[0];
	((__u32 *)dst)[1] = ctx->user_ip6[1];
	((__u32 *)dst)[2] = ctx->user_ip6[2];
	((__u32 *)dst)[3] = ctx->user_ip6[3];
	((__u32 *)src)[0] = sk->src_ip6[0];
	((__u32 *)src)[1] = sk->src_ip6[1];
	((__u32 *)src)[2] = sk->src_ip6[2];
	((__u32 *)src)[3] = sk->src_ip6[3];
	netns = bpf_get_netns_cookie(ctx);
	to = mc_connect(ctx, sk, netns, dst, src, bpf_ntohs(ctx->user_port), tcp, &pod, &orig, &slotted);
	if (to && pod) {
		/* REDIRECT semantics: locally generated traffic goes to 127.0.0.1 / ::1
		 * (or a slot of either); a v4-mapped destination stays v4-mapped. The words are decided
		 * first and stored once, each at its own offset (barrier_var): with
		 * a store per branch, clang 19 kept a pointer into the ctx (ctx + 8)
		 * across the slot's calls, which the verifier refuses ("dereference
		 * of modified ctx ptr"); clang 14 did not. */
		__u32 w0 = 0, w2 = 0, w3 = bpf_htonl(1);

		bool bind = mc_is_unspecified(src);

		if (mc_is_v4mapped(dst)) {
			w2 = bpf_htonl(0x0000ffff);
			w3 = slotted ? mc_slotted_addr4(ctx, sk, netns, pod, dst, orig.port, to, &orig) : bpf_htonl(0x7f000001);
			if (mc_src_in_views(w3))
				bind = false;
		} else if (slotted) {
			__u32 slot = mc_slotted_addr6(ctx, sk, netns, pod, dst, src, orig.port, to, &orig);

			if (slot) {
				w0 = bpf_htonl(MC_SLOT6_W0);
				w3 = slot;
			}
		}
		/* mc_slotted_addr6 took a slot only for a socket bound to the
		 * pod's address, by the app or here */
		if (bind)
			mc_bind_pod6(ctx, pod, mc_is_v4mapped(dst));
		barrier_var(w0);
		barrier_var(w2);
		barrier_var(w3);
		ctx->user_ip6[0] = w0;
		ctx->user_ip6[1] = 0;
		ctx->user_ip6[2] = w2;
		ctx->user_ip6[3] = w3;
		ctx->user_port = bpf_htons(to);
	}
	return 1;
}
