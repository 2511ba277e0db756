// What loading the stub raw would cost (issue 19 follow-up, see docs/bench-cni.md
// "One shared inbound program"): the stub's instructions with the cookie as an
// immediate and the two pinned maps' fds, one BPF_PROG_LOAD each, no libbpf object.
// Not part of the build: gcc -O2 bench/inbound/raw-stub-load.c -o /tmp/raw -lbpf;
// /tmp/raw <pin root of a loaded datapath> 1000
#include <bpf/bpf.h>
#include <linux/bpf.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#define I(c, d, s, o, i) ((struct bpf_insn){ .code = (c), .dst_reg = (d), .src_reg = (s), .off = (o), .imm = (i) })
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
static double cpu(void) { struct rusage u; getrusage(RUSAGE_SELF, &u); return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3; }
int main(int argc, char **argv) {
	char p[512];
	snprintf(p, sizeof p, "%s/maps/mc_inbound_arg", argv[1]);
	int arg = bpf_obj_get(p);
	snprintf(p, sizeof p, "%s/maps/mc_inbound_tail", argv[1]);
	int tail = bpf_obj_get(p);
	if (arg < 0 || tail < 0) { perror("obj_get"); return 1; }
	unsigned long long cookie = 0x123456789ULL;
	struct bpf_insn insns[] = {
		I(BPF_ALU64 | BPF_MOV | BPF_X, 6, 1, 0, 0),            // r6 = ctx
		I(BPF_LDX | BPF_W | BPF_MEM, 1, 6, 12, 0),              // r1 = ctx->protocol
		I(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 2, 6),               // if TCP goto +2
		I(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 1),             // r0 = SK_PASS
		I(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
		I(BPF_ST | BPF_W | BPF_MEM, 10, 0, -4, 0),              // *(u32*)(fp-4) = 0
		I(BPF_ALU64 | BPF_MOV | BPF_X, 2, 10, 0, 0),
		I(BPF_ALU64 | BPF_ADD | BPF_K, 2, 0, 0, -4),
		I(BPF_LD | BPF_DW | BPF_IMM, 1, BPF_PSEUDO_MAP_FD, 0, arg), I(0, 0, 0, 0, 0),
		I(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_lookup_elem),
		I(BPF_JMP | BPF_JNE | BPF_K, 0, 0, 2, 0),               // if r0 goto +2
		I(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0),             // SK_DROP
		I(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
		I(BPF_LD | BPF_DW | BPF_IMM, 1, 0, 0, (int)(cookie & 0xffffffff)), I(0, 0, 0, 0, (int)(cookie >> 32)),
		I(BPF_STX | BPF_DW | BPF_MEM, 0, 1, 0, 0),              // a->netns = cookie
		I(BPF_ALU64 | BPF_MOV | BPF_X, 1, 6, 0, 0),
		I(BPF_LD | BPF_DW | BPF_IMM, 2, BPF_PSEUDO_MAP_FD, 0, tail), I(0, 0, 0, 0, 0),
		I(BPF_ALU64 | BPF_MOV | BPF_K, 3, 0, 0, 0),
		I(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_tail_call),
		I(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0),             // slot empty: SK_DROP (loopback check omitted here)
		I(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
	};
	int n = atoi(argv[2]);
	LIBBPF_OPTS(bpf_prog_load_opts, o, .expected_attach_type = BPF_SK_LOOKUP);
	double t0 = now(), c0 = cpu();
	for (int i = 0; i < n; i++) {
		int fd = bpf_prog_load(BPF_PROG_TYPE_SK_LOOKUP, "mc_inbound_pod", "Dual BSD/GPL", insns, sizeof insns / sizeof insns[0], &o);
		if (fd < 0) { perror("prog_load"); return 1; }
		close(fd);
	}
	printf("raw stub load: wall %.4f ms, CPU %.4f ms per load (%d loads)\n", (now() - t0) / n, (cpu() - c0) / n, n);
	return 0;
}
