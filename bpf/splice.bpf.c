// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The app<->proxy splice's sk_msg verdict, attached to mc_splice (sockops.bpf.c
 * puts both sockets of a connection there). Its own object so that a kernel
 * that cannot load it loses the (optional, off by default) splice and nothing
 * else: the loader treats it as optional.
 */
#include "mc_common.h"
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The peer's TCP state, read with fault-safe probe reads (an sk_msg program
 * cannot release a sockhash lookup's reference, so it cannot take one), if
 * the socket recorded under its tuple is still that socket. */
struct mc_peer {
	__u32 copied_seq;
	__u32 queued; /* its psock ingress queue, bytes; UINT_MAX: unknown */
	__s32 rcvbuf;
};

MC_INLINE bool mc_peer_state(const struct mc_tuple *key, struct mc_peer *out)
{
	struct mc_sockref *ref = bpf_map_lookup_elem(&mc_splice_ref, key);
	struct tcp_sock *tp;
	struct sk_psock *ps;
	const void *ulp;
	void *ud;
	__u64 cookie;

	if (!ref || !ref->addr)
		return false;
	tp = (struct tcp_sock *)ref->addr;
	cookie = BPF_CORE_READ(tp, inet_conn.icsk_inet.sk.__sk_common.skc_cookie.counter);
	if (cookie != ref->cookie) /* freed, maybe reused: not our peer any more */
		return false;
	ulp = BPF_CORE_READ(tp, inet_conn.icsk_ulp_ops);
	if (ulp) /* kTLS: its sk_msg program sees plaintext; never hand that over */
		return false;
	out->copied_seq = BPF_CORE_READ(tp, copied_seq);
	out->rcvbuf = BPF_CORE_READ(tp, inet_conn.icsk_inet.sk.sk_rcvbuf);
	out->queued = ~0u;
	if (bpf_core_field_exists(struct sk_psock, msg_tot_len)) {
		/* sk_user_data carries flag bits (SK_USER_DATA_PSOCK, ...) in its low bits. */
		ud = BPF_CORE_READ(tp, inet_conn.icsk_inet.sk.sk_user_data);
		ps = (struct sk_psock *)((unsigned long)ud & ~7ul);
		if (ps)
			out->queued = BPF_CORE_READ(ps, msg_tot_len);
	}
	return true;
}

/*
 * A message may skip TCP only if that cannot overtake, corrupt or flood the
 * peer (issue 20). The peer's reader (tcp_bpf_recvmsg) serves its psock queue
 * before its TCP receive queue, so:
 *  - TCP -> redirect is safe only once the peer has read every byte this
 *    socket ever sent through TCP: our write_seq == its copied_seq (one
 *    sequence space; a stale copied_seq can only be lower, so a racing read
 *    errs towards TCP). This covers bytes in flight, in the peer's receive
 *    queue, and those still behind a full accept queue or a SYN cookie.
 *  - redirect -> TCP is always order-safe (the older bytes sit in the psock
 *    queue, which is read first), and it is the backpressure: once the peer's
 *    psock queue holds its receive buffer's worth, TCP and its window carry
 *    the rest until the peer catches up. Once the equality holds it stays
 *    true while we redirect (neither number moves), so a connection does not
 *    flap between the paths on its own.
 *  - no ULP on either side: a kTLS socket's sk_msg program sees plaintext.
 */
SEC("sk_msg")
int mc_splice_msg(struct sk_msg_md *m)
{
	struct mc_tuple peer = {};
	struct mc_peer them = {};
	struct tcp_sock *me;
	struct bpf_sock *msk = m->sk;

	if (!msk)
		return SK_PASS;
	me = bpf_skc_to_tcp_sock(msk);
	if (!me || me->inet_conn.icsk_ulp_ops)
		return SK_PASS;

	/* The peer sees this connection reversed. */
	peer.netns = bpf_get_netns_cookie(m);
	if (m->family == AF_INET) {
		mc_v4mapped(peer.laddr, m->remote_ip4);
		mc_v4mapped(peer.raddr, m->local_ip4);
	} else {
		((__u32 *)peer.laddr)[0] = m->remote_ip6[0];
		((__u32 *)peer.laddr)[1] = m->remote_ip6[1];
		((__u32 *)peer.laddr)[2] = m->remote_ip6[2];
		((__u32 *)peer.laddr)[3] = m->remote_ip6[3];
		((__u32 *)peer.raddr)[0] = m->local_ip6[0];
		((__u32 *)peer.raddr)[1] = m->local_ip6[1];
		((__u32 *)peer.raddr)[2] = m->local_ip6[2];
		((__u32 *)peer.raddr)[3] = m->local_ip6[3];
	}
	peer.lport = (__u16)bpf_ntohl(m->remote_port);
	peer.rport = (__u16)m->local_port;

	/* No peer yet (the proxy's socket enters at PASSIVE_ESTABLISHED): TCP. */
	if (!mc_peer_state(&peer, &them))
		return SK_PASS;
	if (me->write_seq != them.copied_seq)
		return SK_PASS;
	if (them.rcvbuf < 0 || (__u64)them.queued + m->size > (__u64)them.rcvbuf)
		return SK_PASS;
	bpf_msg_redirect_hash(m, &mc_splice, &peer, BPF_F_INGRESS);
	return SK_PASS;
}
