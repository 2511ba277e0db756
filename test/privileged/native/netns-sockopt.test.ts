// netnsCookie on real namespaces, getOriginalDst's error path on a plain TCP
// socket (the positive case is covered through the datapath tests).
import { afterAll, describe, expect, it } from 'vitest';
import { describeEbpf } from '../../helpers/datapaths.js';
import net from 'node:net';
import * as bpf from '../../../src/native/addon.js';
import { NativeError } from '../../../src/native/errors.js';
import { makeNetns, removeNetns } from './kernel-env.js';

describeEbpf('netnsCookie', () => {
  let ns: { name: string; path: string } | undefined;
  afterAll(() => removeNetns(ns?.name));

  it('differs between namespaces and is stable across calls', async () => {
    ns = await makeNetns();
    const host = await bpf.netnsCookie('/proc/self/ns/net');
    const pod = await bpf.netnsCookie(ns.path);
    expect(typeof host).toBe('bigint');
    expect(pod).not.toBe(host);
    expect(await bpf.netnsCookie(ns.path)).toBe(pod);
    // Many at once: each runs on its own thread; the JS thread never moves.
    const many = await Promise.all(Array.from({ length: 8 }, (_, i) => bpf.netnsCookie(i % 2 ? ns!.path : '/proc/self/ns/net')));
    expect(many).toEqual(Array.from({ length: 8 }, (_, i) => (i % 2 ? pod : host)));
    expect(await bpf.netnsCookie('/proc/self/ns/net')).toBe(host);
  });

  it('rejects with ENOENT naming a missing netns path', async () => {
    const missing = '/var/run/netns/meshcap-test-native-does-not-exist';
    const err = await bpf.netnsCookie(missing).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(NativeError);
    expect(err).toMatchObject({ code: 'ENOENT', object: missing, syscall: 'open' });
    expect((err as Error).message).toContain(missing);
  });

  it('rejects a path that is not a netns', async () => {
    await expect(bpf.netnsCookie('/proc/self/ns/uts')).rejects.toMatchObject({ code: 'EINVAL', syscall: 'setns' });
  });
});

describe('getOriginalDst', () => {
  it('fails with a NativeError on a socket that was not redirected', async () => {
    const server = net.createServer();
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const accepted = new Promise<net.Socket>((r) => server.once('connection', r));
    const client = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
    try {
      const sock = await accepted;
      const fd = (sock as unknown as { _handle: { fd: number } })._handle.fd;
      expect(fd).toBeGreaterThan(2);
      let err: unknown;
      try {
        bpf.getOriginalDst(fd, 'ipv4');
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(NativeError);
      expect(['ENOENT', 'ENOPROTOOPT']).toContain((err as NativeError).code);
      expect((err as NativeError).object).toBe(`fd ${fd}`);
      expect(() => bpf.getOriginalDst(fd, 'ipv6')).toThrow(NativeError);
      sock.destroy();
    } finally {
      client.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    }
  });
});
