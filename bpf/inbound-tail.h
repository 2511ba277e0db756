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

/* The stub hands its pod to mc_inbound_main through this CPU's slot: a BPF
 * program runs with migration disabled and the tail call follows the write
 * at once, with no helper call in between, on the same CPU. */
struct mc_inbound_arg {
	__u64 netns;
	/* connections the stub refused because slot 0 was empty (per CPU) */
	__u64 tail_failed;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mc_inbound_arg);
} mc_inbound_arg SEC(".maps");

#endif /* MC_INBOUND_TAIL_H */
