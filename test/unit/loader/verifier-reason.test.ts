import { describe, expect, it } from 'vitest';
import { hasVerifierLog, verifierReason } from '../../../src/loader/probe.js';

// Shaped like a real libbpf log of a refused program (from this kernel).
const LOG = `libbpf: prog 'mc_connect6': BPF program load failed: Permission denied
libbpf: prog 'mc_connect6': -- BEGIN PROG LOAD LOG --
0: R1=ctx() R10=fp0
; int mc_connect6(struct bpf_sock_addr *ctx) @ outbound.bpf.c:170
0: (bf) r6 = r1                       ; R1=ctx() R6_w=ctx()
67: (07) r3 += 28
R3 pointer arithmetic on sock prohibited
processed 60 insns (limit 1000000) max_states_per_insn 0 total_states 3 peak_states 3 mark_read 0
-- END PROG LOAD LOG --
libbpf: prog 'mc_connect6': failed to load: -13`;

describe('verifierReason', () => {
  it('picks the verifier\'s own sentence, not libbpf\'s summary', () => {
    expect(verifierReason(LOG, 'fallback')).toBe('R3 pointer arithmetic on sock prohibited');
  });
  it('names a helper the program type may not call', () => {
    expect(verifierReason('7: (85) call bpf_get_netns_cookie#122\nprogram of this type cannot use helper bpf_get_netns_cookie#122\nprocessed 8 insns', 'x'))
      .toBe('program of this type cannot use helper bpf_get_netns_cookie#122');
  });
  it('falls back when there is no log', () => {
    expect(verifierReason(undefined, 'no log')).toBe('no log');
  });
});

describe('hasVerifierLog', () => {
  // The verifier refuses with EACCES, as a missing capability does: only the
  // log tells a rejected program from a refused load (the probe's "not permitted").
  it('a verifier walk: a rejection, not a permission refusal', () => {
    expect(hasVerifierLog(LOG)).toBe(true);
  });
  it('no log, or libbpf\'s lines only: the load never reached the verifier', () => {
    expect(hasVerifierLog(undefined)).toBe(false);
    expect(hasVerifierLog('')).toBe(false);
    expect(hasVerifierLog("libbpf: prog 'mc_connect4': BPF program load failed: Operation not permitted\nlibbpf: prog 'mc_connect4': failed to load: -1\n")).toBe(false);
  });
});
