/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * What a pod's stub (inbound-stub.bpf.c) and the node's shared inbound
 * program (inbound-shared.bpf.c) share, pinned by name under the pin root's
 * maps/ like every other map. No other map: the stub carries none of
 * meshcap.h's, so loading it reuses two pins only.
 */
#ifndef MC_INBOUND_TAIL_H
#define MC_INBOUND_TAIL_H

/* Slot MC_INBOUND_SLOT: mc_inbound_main, put there (and replaced, by one
 * atomic map update) by each datapath load. Kept by its pin: the kernel
 * empties a prog array once no fd or pin holds it, whatever programs use it. */
#define MC_INBOUND_SLOT 0
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} mc_inbound_tail SEC(".maps");

/*
 * The stub hands its pod to mc_inbound_main through this CPU's slot. A BPF
 * program runs with migration disabled but not always with bottom halves or
 * preemption disabled: an sk_lookup made in process context (a cgroup
 * program's bpf_sk_lookup_tcp, an nftables/xt socket match on locally
 * generated packets) can be interrupted by a softirq delivering a SYN, or
 * preempted by another task, between its stub's write and the shared
 * program's read, and those run stubs on the same CPU. So the slot has
 * MC_INBOUND_HANDS hands, each claimed by one lookup at a time: the stub
 * claims a free one with a compare-and-swap of `owner` from 0 to its ctx
 * pointer (the kernel's bpf_sk_lookup_kern of this lookup, on the caller's
 * stack: no two lookups in flight share it), writes the cookie, tail-calls;
 * the shared program takes the hand whose owner is its ctx and frees it.
 * Nothing else writes a claimed hand, so the cookie read is the one its own
 * stub wrote, whatever ran in between. A SYN delivery (bottom halves
 * disabled) is never interrupted by another lookup and takes hand 0 unless a
 * process-context lookup it interrupted holds it. Storing and comparing a
 * pointer needs CAP_PERFMON (bpf_allow_ptr_leaks), which the agent's
 * SYS_ADMIN gives; BPF_CMPXCHG needs 5.12.
 *
 * ABI: this layout is the stubs' and the shared program's contract. Before
 * 2026-11-25 the value was { netns, tail_failed } (16 bytes, one unguarded
 * cookie per CPU); a load that finds that size pinned makes a new prog array
 * and arg and moves every stub onto them (src/loader/inbound-shared.ts): a
 * stub only ever tail-calls a program of its own layout.
 */
#define MC_INBOUND_HANDS 4
struct mc_inbound_hand {
	__u64 owner; /* the claiming lookup's ctx pointer; 0: free */
	__u64 netns;
};

struct mc_inbound_arg {
	struct mc_inbound_hand hand[MC_INBOUND_HANDS];
	/* connections the stub refused because slot 0 was empty, or (never seen:
	 * MC_INBOUND_HANDS lookups in flight on one CPU) no hand was free; per
	 * CPU, not atomic: a diagnostic */
	__u64 tail_failed;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mc_inbound_arg);
} mc_inbound_arg SEC(".maps");

#endif /* MC_INBOUND_TAIL_H */
