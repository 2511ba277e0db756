// The addon's JS surface without root or kernel objects: bad arguments are
// TypeErrors (never a crash), errors from plain syscalls are NativeErrors,
// and consts carries the names the rest of meshcap uses.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { closeSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import * as bpf from '../../../src/native/addon.js';
import { NativeError } from '../../../src/native/errors.js';

let dir: string;
let plainFd: number;
beforeAll(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'meshcap-native-unit-'));
  writeFileSync(path.join(dir, 'plain'), 'not a bpf object');
  plainFd = openSync(path.join(dir, 'plain'), 'r');
});
afterAll(() => {
  closeSync(plainFd);
  rmSync(dir, { recursive: true, force: true });
});

// Deliberately ill-typed calls, as plain JS could make them.
const loose = bpf as unknown as Record<string, (...args: unknown[]) => unknown>;

describe('argument validation', () => {
  const cases: [string, unknown[], RegExp][] = [
    ['mapLookup', ['3', Buffer.alloc(4), 8], /mapLookup: fd must be a number/],
    ['mapLookup', [-1, Buffer.alloc(4), 8], /mapLookup: fd must be an integer in \[0, 2147483647\], got -1/],
    ['mapLookup', [1.5, Buffer.alloc(4), 8], /must be an integer/],
    ['mapLookup', [NaN, Buffer.alloc(4), 8], /must be an integer/],
    ['mapUpdate', [5, 'key', Buffer.alloc(8)], /mapUpdate: fd 5 is not a bpf-map|mapUpdate: key must be a Buffer/],
    ['mapKeys', [5], /fd 5 is not a bpf-map|keySize must be a number/],
    ['mapUpdateBatch', [5, 'x', []], /fd 5 is not a bpf-map|keys must be an array of Buffers/],
    ['mapUpdateEach', [5, 'x', []], /fd 5 is not a bpf-map|keys must be an array of Buffers/],
    ['linkCreateCgroup', [3, 42, 10], /linkCreateCgroup: cgroupPath must be a string/],
    ['linkCreateCgroup', [3, '', 10], /cgroupPath must not be empty/],
    ['linkCreateCgroup', [3, '/sys/fs/cgroup\0x', 10], /must not contain NUL bytes/],
    ['linkCreateNetns', [3, '/proc/self/ns/net', 'SK_LOOKUP'], /linkCreateNetns: attachType must be a number/],
    ['linkUpdate', [3, {}], /linkUpdate: newProgFd must be a number/],
    ['linkDetach', [], /linkDetach: linkFd must be a number/],
    ['objPin', [3], /objPin: path must be a string/],
    ['objGet', [null], /objGet: path must be a string/],
    ['closeFd', [1], /refusing to close stdio fd 1/],
    ['probeProgType', ['CGROUP_SOCK_ADDR'], /probeProgType: progType must be a number/],
    ['probeHelper', [18], /probeHelper: helperId must be a number/],
    ['probeAttach', [18, 10], /probeAttach: targetPath must be a string/],
    ['getOriginalDst', [3, 'ipv5'], /level must be 'ipv4' or 'ipv6', got 'ipv5'/],
    ['getOriginalDst', [3], /getOriginalDst: level must be a string/],
    ['openObject', [undefined], /openObject: path must be a string/],
    ['openObject', ['/x.o', 'pins'], /openObject: opts must be an object/],
    ['openObject', ['/x.o', { mapPinDir: 7 }], /opts.mapPinDir must be a string/],
  ];
  it.each(cases)('%s(%j) throws a TypeError', (fn, args, msg) => {
    const f = loose[fn]!;
    expect(() => f(...args)).toThrow(TypeError);
    expect(() => f(...args)).toThrow(msg);
  });

  it('netnsCookie validates synchronously', () => {
    expect(() => loose.netnsCookie!(42)).toThrow(TypeError);
  });

  it('refuses a non-BPF fd before asking the kernel', () => {
    expect(() => bpf.linkInfo(plainFd)).toThrow(new RegExp(`linkInfo: fd ${plainFd} is not a bpf-link \\(it is /`));
    expect(() => bpf.mapKeys(plainFd, 4)).toThrow(TypeError);
    expect(() => bpf.mapInfo(plainFd)).toThrow(TypeError);
  });
});

describe('NativeError from plain syscalls', () => {
  it('a closed fd is EBADF', () => {
    const fd = openSync(path.join(dir, 'plain'), 'r');
    closeSync(fd);
    expect(() => bpf.progInfo(fd)).toThrow(NativeError);
    expect(() => bpf.progInfo(fd)).toThrow(expect.objectContaining({ code: 'EBADF', errno: 9, object: `fd ${fd}` }));
  });

  it('openObject of a non-ELF file names the path', () => {
    const p = path.join(dir, 'plain');
    let err: unknown;
    try {
      bpf.openObject(p);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(NativeError);
    expect(err).toMatchObject({ syscall: 'bpf_object__open_file', object: p });
    expect((err as NativeError).log).toMatch(/libbpf: /);
  });

  it('getOriginalDst on a file fd is ENOTSOCK', () => {
    expect(() => bpf.getOriginalDst(plainFd, 'ipv4')).toThrow(expect.objectContaining({ code: 'ENOTSOCK', errno: 88 }));
  });
});

describe('consts', () => {
  it('has the names meshcap uses, with the kernel ABI numbers', () => {
    const c = bpf.consts;
    // The uapi numbers are stable ABI, so spot checks against them are exact.
    expect(c.progType.CGROUP_SOCK_ADDR).toBe(18);
    expect(c.progType.SOCK_OPS).toBe(13);
    expect(c.progType.SK_MSG).toBe(16);
    expect(c.progType.SK_LOOKUP).toBe(30);
    expect(c.progType.SCHED_CLS).toBe(3);
    expect(c.progType.CGROUP_SOCKOPT).toBe(25);
    expect(c.attachType.CGROUP_INET4_CONNECT).toBe(10);
    expect(c.attachType.CGROUP_INET6_CONNECT).toBe(11);
    expect(c.attachType.CGROUP_SOCK_OPS).toBe(3);
    expect(c.attachType.SK_MSG_VERDICT).toBe(7);
    expect(c.attachType.CGROUP_GETSOCKOPT).toBe(21);
    expect(c.attachType.SK_LOOKUP).toBe(36);
    expect(c.mapType.HASH).toBe(1);
    expect(c.mapType.LPM_TRIE).toBe(11);
    expect(c.mapType.SOCKHASH).toBe(18);
    expect(c.linkType.CGROUP).toBe(3);
    expect(c.linkType.NETNS).toBe(5);
    expect(c.helper.map_lookup_elem).toBe(1);
    expect(c.helper.get_netns_cookie).toBe(122);
    expect(c.helper.get_socket_cookie).toBe(46);
    expect(c.helper.sk_assign).toBe(124);
    expect([c.BPF_ANY, c.BPF_NOEXIST, c.BPF_EXIST, c.BPF_F_REPLACE]).toEqual([0, 1, 2, 4]);
  });

  it('tables are complete and dense (generated from <linux/bpf.h>)', () => {
    for (const table of [bpf.consts.progType, bpf.consts.attachType, bpf.consts.mapType, bpf.consts.linkType, bpf.consts.helper]) {
      const values = Object.values(table).sort((a, b) => a - b);
      expect(values[0]).toBe(0);
      expect(values).toEqual(values.map((_, i) => i)); // 0..n-1, no gaps, no duplicates
    }
    expect(Object.keys(bpf.consts.helper).length).toBeGreaterThan(200);
    for (const name of Object.keys(bpf.consts.attachType)) expect(name).toMatch(/^[A-Z0-9_]+$/);
  });

  it('libbpfVersion', () => {
    expect(bpf.libbpfVersion()).toMatch(/^v1\.\d+/);
  });
});
