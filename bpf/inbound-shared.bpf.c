// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Inbound capture, one program per node: loaded (and verified) once by each
 * datapath load and put in slot 0 of mc_inbound_tail, where every pod's stub
 * (inbound-stub.bpf.c) tail-calls it with the pod's netns cookie in this
 * CPU's mc_inbound_arg (a hand of it: inbound-tail.h). Decides as mc_inbound in inbound.bpf.c (the
 * per-pod program of meshcap before issue 19, whose pinned instances keep
 * working): inbound-decide.h holds the steps.
 */
#define BPF_NO_PRESERVE_ACCESS_INDEX
#include "mc_common.h"
#include "inbound-tail.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The cookie this lookup's stub wrote, from the hand it claimed
 * (inbound-tail.h), which is freed here, on every path. 0 (no pod: pass)
 * only for a lookup that came through no stub of this layout (a test run of
 * this program alone). */
static __always_inline __u64 mc_arg_take(struct bpf_sk_lookup *ctx)
{
	__u32 zero = 0;
	struct mc_inbound_arg *a = bpf_map_lookup_elem(&mc_inbound_arg, &zero);
	__u64 netns;

	if (!a)
		return 0;
#pragma unroll
	for (int i = 0; i < MC_INBOUND_HANDS; i++) {
		if (a->hand[i].owner == (__u64)ctx) {
			netns = a->hand[i].netns;
			a->hand[i].owner = 0;
			return netns;
		}
	}
	return 0;
}

#define MC_INBOUND_NETNS() (arg_netns)
#include "inbound-decide.h"

SEC("sk_lookup")
int mc_inbound_main(struct bpf_sk_lookup *ctx)
{
	/* taken before anything else: the hand is freed whatever the verdict */
	return mc_inbound_decide(ctx, mc_arg_take(ctx));
}
