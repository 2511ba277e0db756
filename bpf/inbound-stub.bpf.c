// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * A meshed pod's inbound program: attached to the pod's netns (sk_lookup),
 * it only names its pod (in a hand of this CPU's mc_inbound_arg it claims for
 * this lookup: inbound-tail.h) and tail-calls the node's shared mc_inbound_main
 * (inbound-shared.bpf.c), which decides exactly as mc_inbound
 * (inbound.bpf.c) does. sk_lookup cannot call bpf_get_netns_cookie, so each
 * pod still needs a program of its own; this one is a few instructions, so
 * the verifier's work per pod is near nothing (docs/datapath.md).
 *
 * The object is loaded once per prog array as a template; each stub is the
 * template's final instructions with the one ld_imm64 of mc_stub_netns (the
 * .bss) pointed at a fresh 1-entry array of its own, loaded by a single
 * BPF_PROG_LOAD (native/addon/src/prog_template.cc). The agent keeps a few
 * loaded ahead and writes the pod's cookie into that array at ADD, before
 * the link exists (src/pod-datapath/inbound-pool.ts).
 */
#define BPF_NO_PRESERVE_ACCESS_INDEX
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "inbound-tail.h"

#define AF_INET 2 /* not in vmlinux.h (a macro) */

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The pod's netns cookie, in the stub's own map (each instance gets its own
 * array in place of the .bss). 0: no pod yet, so nothing is captured. */
__u64 mc_stub_netns SEC(".bss");

/*
 * The pod's own traffic: a loopback (or unspecified) address on either side,
 * or the proxy's ::6 passthrough source. mc_inbound_decide passes exactly
 * these first (mc_is_loopback, mc_is_passthrough6), and every redirected
 * outbound connection is one (the app to its proxy on 127.x or ::1), so the
 * stub passes them itself: no hand claimed, no tail call (issue 19 item 2:
 * per-connection cost). Each ctx field is loaded once, on its own
 * (barrier_var), as the shared program does: clang would otherwise merge the
 * v4 and v6 loads into one from a computed ctx offset, which the verifier
 * refuses.
 */
static __always_inline bool mc_own4(__u32 a)
{
	/* network order: the first octet is the low byte */
	return (a & 0xff) == 127 || a == 0;
}

static __always_inline bool mc_own6(__u32 w0, __u32 w1, __u32 w2, __u32 w3)
{
	if ((w0 | w1) != 0)
		return false;
	if (w2 == bpf_htonl(0x0000ffff)) /* v4-mapped: 127.0.0.0/8 or 0.0.0.0 */
		return mc_own4(w3);
	return w2 == 0 && (w3 == bpf_htonl(1) || w3 == 0);
}

static __always_inline bool mc_pod_own(struct bpf_sk_lookup *ctx)
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

SEC("sk_lookup")
int mc_inbound_pod(struct bpf_sk_lookup *ctx)
{
	struct mc_inbound_hand *h = NULL;
	struct mc_inbound_arg *a;
	__u32 zero = 0;
	__u64 netns;

	if (ctx->protocol != IPPROTO_TCP)
		return SK_PASS;
	netns = *(volatile __u64 *)&mc_stub_netns;
	if (!netns)
		return SK_PASS;
	/* Never captured, whatever the shared program or its absence (an empty
	 * slot 0 below) would say: the app to its proxy, the proxy's
	 * passthrough to the app. */
	if (mc_pod_own(ctx))
		return SK_PASS;
	a = bpf_map_lookup_elem(&mc_inbound_arg, &zero);
	if (!a)
		return SK_DROP; /* cannot happen: key 0 of a 1-entry array */
	/* Claim a free hand for this lookup (inbound-tail.h): hand 0 unless a
	 * lookup this one interrupted or preempted holds it. */
#pragma unroll
	for (int i = 0; i < MC_INBOUND_HANDS; i++) {
		if (__sync_val_compare_and_swap(&a->hand[i].owner, 0, (__u64)ctx) == 0) {
			h = &a->hand[i];
			break;
		}
	}
	if (h) {
		h->netns = netns;
		bpf_tail_call(ctx, &mc_inbound_tail, MC_INBOUND_SLOT);
		h->owner = 0; /* slot 0 empty: nobody took the hand */
	}

	/* Slot 0 empty (or, never seen, no free hand): which ports are captured
	 * is unknown here, and the pod's own traffic has passed above. Anything
	 * else is refused, as a REDIRECT to a proxy that is not there would be:
	 * a captured connection must never reach the app around its proxy. */
	a->tail_failed++;
	return SK_DROP;
}
