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
#include "mc_addr.h"
#include "inbound-tail.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The pod's netns cookie, in the stub's own map (each instance gets its own
 * array in place of the .bss). 0: no pod yet, so nothing is captured. */
__u64 mc_stub_netns SEC(".bss");

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
	 * passthrough to the app. Passed here, the shared program's own first
	 * test (mc_addr.h), with no hand claimed and no tail call: every
	 * redirected outbound connection's SYN is one (issue 19 item 2). */
	if (mc_lookup_own(ctx))
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
