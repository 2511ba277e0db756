// Feature probes against the running kernel.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execa } from 'execa';
import * as bpf from '../../../src/native/addon.js';
import { signalStorm } from '../../helpers/signal-storm.js';
import { makeCgroup, makeNetns, removeCgroup, removeNetns } from './kernel-env.js';

const { progType, attachType, mapType, helper } = bpf.consts;

describe('libbpf probes', () => {
  it('program types', () => {
    expect(bpf.probeProgType(progType.CGROUP_SOCK_ADDR)).toBe(true);
    expect(bpf.probeProgType(progType.SK_LOOKUP)).toBe(true);
    expect(bpf.probeProgType(9999)).toBe(false);
  });
  it('map types', () => {
    expect(bpf.probeMapType(mapType.LPM_TRIE)).toBe(true);
    expect(bpf.probeMapType(mapType.SOCKHASH)).toBe(true);
    expect(bpf.probeMapType(9999)).toBe(false);
  });
  it('helpers', () => {
    expect(bpf.probeHelper(progType.CGROUP_SOCK_ADDR, helper.get_netns_cookie)).toBe(true);
    // bpf_sk_assign exists only for tc and sk_lookup programs
    expect(bpf.probeHelper(progType.SK_LOOKUP, helper.sk_assign)).toBe(true);
    expect(bpf.probeHelper(progType.CGROUP_SOCK_ADDR, helper.sk_assign)).toBe(false);
    expect(bpf.probeHelper(progType.CGROUP_SOCK_ADDR, 99999)).toBe(false);
  });
});

describe('probes without privilege', () => {
  it('throw EPERM instead of answering "unsupported"', async () => {
    // A child as nobody (no capabilities): libbpf's probes would say "no" to
    // everything there, which a caller would take for an old kernel.
    const script =
      `const a = require(${JSON.stringify(bpf.addonPath)});` +
      'for (const f of [() => a.probeProgType(18), () => a.probeMapType(1), () => a.probeHelper(18, 1)])' +
      '  try { f(); console.log("answered"); } catch (e) { console.log(e.code, e.syscall); }';
    const { stdout } = await execa('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, '-e', script]);
    expect(stdout.split('\n')).toEqual(['EPERM probeProgType', 'EPERM probeMapType', 'EPERM probeHelper']);
  });
});

describe('probes against a scratch cgroup and netns', () => {
  let cg: string | undefined;
  let ns: { name: string; path: string } | undefined;
  beforeAll(async () => {
    cg = makeCgroup();
    ns = await makeNetns();
  });
  afterAll(async () => {
    removeCgroup(cg);
    await removeNetns(ns?.name);
  });

  it('trial-attaches cgroup connect4 and sk_lookup, leaving nothing attached', async () => {
    expect(bpf.probeAttach(progType.CGROUP_SOCK_ADDR, attachType.CGROUP_INET4_CONNECT, cg!)).toEqual({ ok: true });
    expect(bpf.probeAttach(progType.SK_LOOKUP, attachType.SK_LOOKUP, ns!.path)).toEqual({ ok: true });
    // bpftool as an independent observer: nothing stays attached to the cgroup.
    const { stdout } = await execa('bpftool', ['-j', 'cgroup', 'show', cg!]);
    expect(stdout.trim() === '' ? [] : JSON.parse(stdout)).toEqual([]);
  });

  it('reports which step failed', () => {
    // connect4 program on the sk_lookup hook: loads, but cannot be linked there
    expect(bpf.probeAttach(progType.CGROUP_SOCK_ADDR, attachType.CGROUP_INET4_CONNECT, ns!.path)).toMatchObject({
      ok: false,
      syscall: 'bpf_link_create',
    });
    expect(bpf.probeAttach(9999, attachType.CGROUP_INET4_CONNECT, cg!)).toMatchObject({ ok: false, code: 'EINVAL', syscall: 'bpf_prog_load' });
    expect(() => bpf.probeAttach(progType.CGROUP_SOCK_ADDR, attachType.CGROUP_INET4_CONNECT, '/nonexistent/cg')).toThrow(
      expect.objectContaining({ code: 'ENOENT', syscall: 'open' }),
    );
  });

  it('every probe answers through a storm of signals as without one', async () => {
    // The verifier gives up with EAGAIN on a pending signal, which libbpf's
    // probes read as "no": a node would have gone to iptables mode for a
    // signal (native/addon/src/common.h, SignalsHeld).
    const storm = await signalStorm();
    const answers: unknown[] = [];
    let sent = 0;
    try {
      for (let i = 0; i < 200; i++) {
        answers.push(
          bpf.probeProgType(progType.CGROUP_SOCK_ADDR),
          bpf.probeProgType(progType.SK_LOOKUP),
          bpf.probeHelper(progType.CGROUP_SOCK_ADDR, helper.get_netns_cookie),
          bpf.probeHelper(progType.CGROUP_SOCK_ADDR, helper.sk_assign),
          bpf.probeAttach(progType.CGROUP_SOCK_ADDR, attachType.CGROUP_INET4_CONNECT, cg!),
          bpf.probeAttach(progType.SK_LOOKUP, attachType.SK_LOOKUP, ns!.path),
        );
      }
    } finally {
      sent = await storm.stop();
    }
    const want = [true, true, true, false, { ok: true }, { ok: true }];
    expect(answers).toEqual(Array.from({ length: 200 }, () => want).flat());
    expect(sent, 'the storm ran through the probes').toBeGreaterThan(10_000);
  });
});
