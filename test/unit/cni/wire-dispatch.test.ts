import { describe, expect, it } from 'vitest';
import { dispatch } from '../../../src/cni/dispatch.js';
import { CniError } from '../../../src/cni/errors.js';
import type { RawRequest } from '../../../src/cni/request.js';
import type { CniHandlers } from '../../../src/cni/types.js';
import { decodeWireRequest, encodeWireReply } from '../../../src/cni/wire.js';

const raw = (over: Partial<RawRequest> = {}): RawRequest => ({
  command: 'ADD', containerId: 'c1', netns: '/var/run/netns/p', ifname: 'eth0',
  args: 'K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p', path: '',
  stdin: JSON.stringify({ cniVersion: '0.4.0', name: 'n', type: 'meshcap-cni', prevResult: { cniVersion: '1.0.0', ips: [{ address: '198.18.0.9/24' }] } }),
  ...over,
});

describe('wire codec', () => {
  it('decodes a v1 request, defaulting absent fields to ""', () => {
    expect(decodeWireRequest(Buffer.from('{"v":1,"command":"DEL","stdin":"{}"}'))).toEqual({
      command: 'DEL', containerId: '', netns: '', ifname: '', args: '', path: '', stdin: '{}',
    });
  });
  it('rejects non-JSON, non-objects, other versions, non-string fields with code 6', () => {
    for (const bad of ['x', '[]', 'null', '{"v":2,"command":"ADD"}', '{"command":"ADD"}', '{"v":1,"netns":5}']) {
      expect(() => decodeWireRequest(Buffer.from(bad))).toThrow(CniError);
      try { decodeWireRequest(Buffer.from(bad)); } catch (e) { expect((e as CniError).code).toBe(6); }
    }
  });
  it('carries the forwarder\'s netns cookie (optional, a non-zero u64 in decimal) to an ADD request, and refuses a malformed one with code 6', async () => {
    const req = (extra: string) => Buffer.from(`{"v":1,"command":"ADD","containerId":"c1","netns":"/var/run/netns/p","ifname":"eth0","args":"K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p","stdin":${JSON.stringify(raw().stdin)}${extra}}`);
    expect(decodeWireRequest(req(',"netnsCookie":"18446744073709551615"')).netnsCookie).toBe('18446744073709551615');
    expect(decodeWireRequest(req('')).netnsCookie).toBeUndefined();
    for (const bad of ['5', '"0"', '"-1"', '"0x10"', '"18446744073709551616"', '"12a"', '""', '"012"']) {
      try {
        decodeWireRequest(req(`,"netnsCookie":${bad}`));
        expect.fail(`netnsCookie ${bad} was accepted`);
      } catch (e) {
        expect((e as CniError).code, bad).toBe(6);
        expect((e as CniError).message).toMatch(/netnsCookie/);
      }
    }
    // the handler gets it as a bigint, on ADD only
    let got: bigint | undefined | null = null;
    const h: CniHandlers = {
      add: async (r) => void (got = r.netnsCookie),
      del: async (r) => void (got = r.netnsCookie),
      check: async () => undefined, status: async () => undefined, gc: async () => undefined,
    };
    await dispatch(decodeWireRequest(req(',"netnsCookie":"4097"')), h);
    expect(got).toBe(4097n);
    await dispatch({ ...raw({ command: 'DEL' }), netnsCookie: '4097' }, h);
    expect(got).toBeUndefined();
  });
  it('encodes a reply', () => {
    expect(JSON.parse(encodeWireReply({ exitCode: 1, stdout: '{"code":7}' }).toString())).toEqual({ exitCode: 1, stdout: '{"code":7}' });
  });
});

describe('dispatch', () => {
  const seen: string[] = [];
  const handlers: CniHandlers = {
    add: async (r) => void seen.push(`add ${r.podNamespace}/${r.podName}`),
    del: async () => void seen.push('del'),
    check: async () => { throw new CniError(3, 'no such pod'); },
    status: async () => { throw new CniError(50, 'not ready'); },
    gc: async (_r, a) => void seen.push(`gc ${a.length}`),
  };

  it('ADD answers the converted prevResult', async () => {
    const o = await dispatch(raw(), handlers);
    expect(o.reply).toEqual({ exitCode: 0, stdout: JSON.stringify({ cniVersion: '0.4.0', ips: [{ version: '4', address: '198.18.0.9/24' }] }) });
    expect(o).toMatchObject({ verb: 'ADD', podNamespace: 'ns', podName: 'p', containerId: 'c1' });
    expect(seen).toContain('add ns/p');
  });
  it("ADD carries the handler's decision and mode into the outcome (the request's log line)", async () => {
    const o = await dispatch(raw(), { ...handlers, add: async () => ({ decision: 'meshed', mode: 'ebpf' }) });
    expect(o).toMatchObject({ decision: 'meshed', mode: 'ebpf', reply: { exitCode: 0 } });
    expect((await dispatch(raw(), handlers)).decision).toBeUndefined();
  });
  it('VERSION, DEL, GC succeed with the right stdout', async () => {
    expect(JSON.parse((await dispatch(raw({ command: 'VERSION', stdin: '' }), handlers)).reply.stdout)).toMatchObject({ cniVersion: '1.1.0' });
    expect((await dispatch(raw({ command: 'DEL' }), handlers)).reply).toEqual({ exitCode: 0, stdout: '' });
    const gc = raw({ command: 'GC', stdin: JSON.stringify({ cniVersion: '1.1.0', name: 'n', type: 't', 'cni.dev/valid-attachments': [{ containerID: 'a', ifname: 'eth0' }] }) });
    expect((await dispatch(gc, handlers)).reply.exitCode).toBe(0);
    expect(seen).toContain('gc 1');
  });
  it('handler CniErrors carry the config version; parse errors too', async () => {
    const c = await dispatch(raw({ command: 'CHECK' }), handlers);
    expect(c.reply.exitCode).toBe(1);
    expect(JSON.parse(c.reply.stdout)).toEqual({ cniVersion: '0.4.0', code: 3, msg: 'no such pod' });
    const bad = await dispatch(raw({ stdin: JSON.stringify({ cniVersion: '0.3.1', name: '!', type: 't' }) }), handlers);
    expect(JSON.parse(bad.reply.stdout)).toMatchObject({ cniVersion: '0.3.1', code: 7 });
    const junk = await dispatch(raw({ stdin: '{' }), handlers);
    expect(JSON.parse(junk.reply.stdout)).toMatchObject({ cniVersion: '1.1.0', code: 6 });
  });
  it('non-CniError becomes 999 and is reported as unexpected', async () => {
    const boom = new TypeError('x is undefined');
    const o = await dispatch(raw(), { ...handlers, add: async () => { throw boom; } });
    expect(JSON.parse(o.reply.stdout)).toEqual({ cniVersion: '0.4.0', code: 999, msg: 'x is undefined' });
    expect(o.unexpected).toBe(boom);
  });
});
