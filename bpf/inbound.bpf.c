// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Inbound capture with sk_lookup, attached to each meshed pod's netns: a new
 * TCP connection to a captured port is given to the proxy's inbound listener
 * (registered in mc_listen by sockops) without rewriting any packet, so the
 * accepted socket's local address is the original destination (TPROXY
 * semantics; cgroup/getsockopt answers SO_ORIGINAL_DST from it for REDIRECT
 * mode). Follows ISTIO_INBOUND: 15008 never captured, excludeInboundPorts,
 * includeInboundPorts '*' or a list; traffic originating inside the pod (from
 * loopback or its own addresses) is never captured.
 */
/* One instance per pod (loaded ahead of the pod by the agent's pool, see
 * src/pod-datapath/inbound-pool.ts): without CO-RE relocations libbpf never
 * parses the kernel's vmlinux BTF (several ms per load). Every struct this
 * program reads is UAPI (bpf_sk_lookup, bpf_sock), whose layout is fixed, so
 * nothing needs relocating. */
#define BPF_NO_PRESERVE_ACCESS_INDEX
#include "mc_common.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* sk_lookup programs cannot call bpf_get_netns_cookie, and each instance is
 * attached to exactly one netns: the agent writes the pod's netns cookie here
 * (this object's .bss map) once, before it links the instance to the pod's
 * netns, so the load itself is not on the CNI ADD's path. Not const: a
 * .rodata constant is frozen at load, before the pod is known. 0 (never a
 * cookie) until written: no pod, no capture. Older meshcap versions set it as
 * a .rodata constant; their pinned instances keep working. */
volatile __u64 mc_netns = 0;

#define MC_INBOUND_NETNS() (mc_netns)
#include "inbound-decide.h"

SEC("sk_lookup")
int mc_inbound(struct bpf_sk_lookup *ctx)
{
	return mc_inbound_decide(ctx, 0);
}
