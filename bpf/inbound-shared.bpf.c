// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Inbound capture, one program per node: loaded (and verified) once by each
 * datapath load and put in slot 0 of mc_inbound_tail, where every pod's stub
 * (inbound-stub.bpf.c) tail-calls it with the pod's netns cookie in this
 * CPU's mc_inbound_arg. Decides as mc_inbound in inbound.bpf.c (the
 * per-pod program of meshcap before issue 19, whose pinned instances keep
 * working): inbound-decide.h holds the steps.
 */
#define BPF_NO_PRESERVE_ACCESS_INDEX
#include "mc_common.h"
#include "inbound-tail.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The cookie the stub wrote just before its tail call; 0 (no pod: pass)
 * cannot happen, the lookup of key 0 never fails. */
static __always_inline __u64 mc_arg_netns(void)
{
	__u32 zero = 0;
	struct mc_inbound_arg *a = bpf_map_lookup_elem(&mc_inbound_arg, &zero);

	return a ? a->netns : 0;
}

#define MC_INBOUND_NETNS() mc_arg_netns()
#include "inbound-decide.h"

SEC("sk_lookup")
int mc_inbound_main(struct bpf_sk_lookup *ctx)
{
	return mc_inbound_decide(ctx);
}
