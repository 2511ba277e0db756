// NativeError message building and libbpf log parsing (pure).
import { describe, expect, it } from 'vitest';
import { NativeError, hintFor, loadFailureSubject, verifierReason, isNativeError } from '../../../src/native/errors.js';

const verifierLog = `libbpf: prog 'unchecked_lookup': BPF program load failed: Permission denied
libbpf: prog 'unchecked_lookup': -- BEGIN PROG LOAD LOG --
0: R1=ctx() R10=fp0
7: (79) r0 = *(u64 *)(r0 +0)
R0 invalid mem access 'map_value_or_null'
processed 7 insns (limit 1000000) max_states_per_insn 0 total_states 0 peak_states 0 mark_read 0
-- END PROG LOAD LOG --
libbpf: prog 'unchecked_lookup': failed to load: -13
libbpf: failed to load object '/tmp/x.bpf.o'
`;

const pinLog = `libbpf: couldn't reuse pinned map at '/sys/fs/bpf/t/counts': parameter mismatch
libbpf: map 'counts': error reusing pinned map
libbpf: map 'counts': failed to create: Invalid argument(-22)
libbpf: failed to load object '/tmp/y.bpf.o'
`;

describe('NativeError', () => {
  it('formats syscall, object, strerror and code', () => {
    const e = new NativeError({ code: 'EBUSY', errno: 16, syscall: 'bpf_link_create', detail: 'Device or resource busy', object: '/sys/fs/cgroup/x' });
    expect(e).toBeInstanceOf(Error);
    expect(e.name).toBe('NativeError');
    expect(e.message).toBe('bpf_link_create /sys/fs/cgroup/x: Device or resource busy (EBUSY)');
    expect(isNativeError(e, 'EBUSY')).toBe(true);
    expect(isNativeError(e, 'EPERM')).toBe(false);
    expect(isNativeError(new Error('x'))).toBe(false);
  });

  it('adds the obvious hints', () => {
    expect(new NativeError({ code: 'EPERM', errno: 1, syscall: 'bpf_prog_load', detail: 'Operation not permitted' }).message).toMatch(/needs root or CAP_BPF/);
    expect(new NativeError({ code: 'ENOENT', errno: 2, syscall: 'bpf_obj_pin', object: '/sys/fs/bpf/x/y' }).message).toMatch(/bpffs not mounted/);
    expect(new NativeError({ code: 'ENOPROTOOPT', errno: 92, syscall: 'getsockopt(SO_NETNS_COOKIE)' }).message).toMatch(/5\.14/);
    expect(hintFor('EAGAIN', 'bpf_map_get_next_key')).toBeUndefined();
    // a netns's routes: the capability, not a BPF one
    expect(new NativeError({ code: 'EPERM', errno: 1, syscall: 'RTM_NEWROUTE', object: '/run/netns/x: local 198.18.0.2 dev lo table 15001' }).message).toMatch(/CAP_NET_ADMIN/);
    expect(hintFor('EPERM', 'RTM_NEWRULE')).not.toMatch(/CAP_BPF/);
    expect(hintFor('EINVAL', 'RTM_NEWRULE')).toMatch(/4\.17/);
  });

  it('names the rejected program and the verifier reason', () => {
    const e = new NativeError({ code: 'EACCES', errno: 13, syscall: 'bpf_object__load', detail: 'Permission denied', object: '/tmp/x.bpf.o', log: verifierLog });
    expect(e.object).toBe("prog 'unchecked_lookup' of /tmp/x.bpf.o");
    expect(e.message).toBe(
      "bpf_object__load prog 'unchecked_lookup' of /tmp/x.bpf.o: Permission denied (EACCES): R0 invalid mem access 'map_value_or_null' - the verifier rejected a program; see .log",
    );
    expect(e.log).toBe(verifierLog);
  });

  it('names the map whose pinned copy is incompatible', () => {
    const e = new NativeError({ code: 'EINVAL', errno: 22, syscall: 'bpf_object__load', detail: 'Invalid argument', object: '/tmp/y.bpf.o', log: pinLog });
    expect(e.object).toBe("map 'counts' of /tmp/y.bpf.o");
    expect(e.message).toMatch(/remove the pin/);
  });
});

describe('log parsing', () => {
  it('loadFailureSubject', () => {
    expect(loadFailureSubject(verifierLog)).toEqual({ kind: 'prog', name: 'unchecked_lookup', reason: "R0 invalid mem access 'map_value_or_null'" });
    expect(loadFailureSubject(pinLog)).toEqual({ kind: 'map', name: 'counts' });
    expect(loadFailureSubject('libbpf: something else\n')).toBeUndefined();
  });
  it('verifierReason skips the statistics lines', () => {
    expect(verifierReason(verifierLog)).toBe("R0 invalid mem access 'map_value_or_null'");
    expect(verifierReason('no log here')).toBeUndefined();
  });
});
