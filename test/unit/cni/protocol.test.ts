// src/cni/'s pure protocol modules, one describe block each: errors, versions,
// result, netconf, env, request.
import { describe, expect, it } from 'vitest';
import { parseCniArgs, validateContainerId, validateIfname } from '../../../src/cni/env.js';
import { CniError, errorVersion } from '../../../src/cni/errors.js';
import { parseNetConf, validAttachments } from '../../../src/cni/netconf.js';
import { parseRequest, type RawRequest } from '../../../src/cni/request.js';
import { convertResult } from '../../../src/cni/result.js';
import { CNI_ERROR_CODES, SUPPORTED_VERSIONS } from '../../../src/cni/rules.js';
import { compareVersions, isSupportedVersion, negotiateVersion, versionInfo } from '../../../src/cni/versions.js';

function codeOf(fn: () => unknown): number {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(CniError);
    return (err as CniError).code;
  }
  throw new Error('expected a CniError');
}

const conf = (extra: Record<string, unknown> = {}, version = '1.1.0') =>
  JSON.stringify({ cniVersion: version, name: 'meshnet', type: 'meshcap-cni', ...extra });

const raw = (over: Partial<RawRequest> = {}): RawRequest => ({
  command: 'ADD',
  containerId: 'abc123',
  netns: '/var/run/netns/pod1',
  ifname: 'eth0',
  args: 'K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-1;K8S_POD_INFRA_CONTAINER_ID=abc123;K8S_POD_UID=u-1',
  path: '/opt/cni/bin',
  stdin: conf(),
  ...over,
});

describe('CniError', () => {
  it('serialises code/msg/details and the result with cniVersion', () => {
    const e = new CniError(11, 'later', 'why');
    expect(e.msg).toBe('later');
    expect(JSON.parse(JSON.stringify(e))).toEqual({ code: 11, msg: 'later', details: 'why' });
    expect(e.toResult('0.4.0')).toEqual({ cniVersion: '0.4.0', code: 11, msg: 'later', details: 'why' });
    expect(new CniError(7, 'x').toJSON()).toEqual({ code: 7, msg: 'x' });
    expect(new CniError(7, 'x').toResult(undefined).cniVersion).toBe('1.1.0');
  });
  it('has the spec error codes', () => {
    expect(CNI_ERROR_CODES).toMatchObject({
      INCOMPATIBLE_VERSION: 1, INVALID_ENV: 4, DECODE_FAILURE: 6, INVALID_NETWORK_CONFIG: 7,
      TRY_AGAIN_LATER: 11, PLUGIN_NOT_AVAILABLE: 50, LIMITED_CONNECTIVITY: 51, INTERNAL: 999,
    });
  });
});

describe('versions', () => {
  it('knows the supported versions', () => {
    expect([...SUPPORTED_VERSIONS]).toEqual(['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0']);
    expect(isSupportedVersion('0.4.0')).toBe(true);
    expect(isSupportedVersion('0.2.0')).toBe(false);
    expect(isSupportedVersion(1)).toBe(false);
  });
  it('compares semver numerically', () => {
    expect(compareVersions('0.10.0', '0.4.0')).toBe(1);
    expect(compareVersions('1.0.0', '1.0.0')).toBe(0);
    expect(compareVersions('0.3.1', '0.4.0')).toBe(-1);
    expect(codeOf(() => compareVersions('1.0', '1.0.0'))).toBe(6);
  });
  it('echoes plausible versions in errors, else the latest', () => {
    expect(errorVersion('0.3.1')).toBe('0.3.1');
    expect(errorVersion('9.9.9')).toBe('9.9.9');
    expect(errorVersion('banana')).toBe('1.1.0');
    expect(errorVersion(undefined)).toBe('1.1.0');
  });
  it('answers VERSION with the requested version when supported', () => {
    expect(versionInfo('0.4.0')).toEqual({ cniVersion: '0.4.0', supportedVersions: [...SUPPORTED_VERSIONS] });
    expect(versionInfo('2.0.0').cniVersion).toBe('1.1.0');
    expect(versionInfo().cniVersion).toBe('1.1.0');
  });
  it('negotiates per verb', () => {
    expect(negotiateVersion('0.3.0', 'ADD')).toBe('0.3.0');
    expect(codeOf(() => negotiateVersion('0.3.1', 'CHECK'))).toBe(1);
    expect(negotiateVersion('0.4.0', 'CHECK')).toBe('0.4.0');
    expect(codeOf(() => negotiateVersion('1.0.0', 'STATUS'))).toBe(1);
    expect(codeOf(() => negotiateVersion('1.0.0', 'GC'))).toBe(1);
    expect(negotiateVersion('1.1.0', 'GC')).toBe('1.1.0');
    expect(codeOf(() => negotiateVersion(undefined, 'ADD'))).toBe(1);
    expect(codeOf(() => negotiateVersion('0.2.0', 'ADD'))).toBe(1);
  });
});

describe('convertResult', () => {
  const v040 = {
    cniVersion: '0.4.0',
    interfaces: [{ name: 'eth0', mac: '02:00:00:00:00:01', sandbox: '/var/run/netns/p' }],
    ips: [
      { version: '4', address: '198.18.0.5/24', gateway: '198.18.0.1', interface: 0 },
      { version: '6', address: '2001:db8::5/64', interface: 0 },
    ],
    routes: [{ dst: '0.0.0.0/0', gw: '198.18.0.1' }],
    dns: { nameservers: ['198.18.0.53'] },
  };
  const v110 = {
    cniVersion: '1.1.0',
    interfaces: [{ name: 'eth0', mac: '02:00:00:00:00:01', sandbox: '/var/run/netns/p', mtu: 1500, socketPath: '/s', pciID: 'p' }],
    ips: [{ address: '198.18.0.5/24', interface: 0 }, { address: '2001:db8::5/64' }],
    routes: [{ dst: '198.18.0.0/15', mtu: 1400, advmss: 1360, priority: 5, table: 100, scope: 0 }],
  };

  it('gives just cniVersion when there is no prevResult', () => {
    for (const v of SUPPORTED_VERSIONS) {
      expect(convertResult(undefined, v)).toEqual({ cniVersion: v });
      expect(convertResult(null, v)).toEqual({ cniVersion: v });
    }
  });
  it('0.4.0 -> 1.x drops ips[].version and keeps the rest', () => {
    for (const v of ['1.0.0', '1.1.0'] as const) {
      const r = convertResult(v040, v);
      expect(r.cniVersion).toBe(v);
      expect(r.ips).toEqual([
        { address: '198.18.0.5/24', gateway: '198.18.0.1', interface: 0 },
        { address: '2001:db8::5/64', interface: 0 },
      ]);
      expect(r.routes).toEqual(v040.routes);
      expect(r.dns).toEqual(v040.dns);
      expect(r.interfaces).toEqual(v040.interfaces);
    }
  });
  it('1.x -> 0.x adds ips[].version from the address and drops 1.1-only fields', () => {
    for (const v of ['0.3.0', '0.3.1', '0.4.0'] as const) {
      const r = convertResult(v110, v);
      expect(r.cniVersion).toBe(v);
      expect(r.ips).toEqual([
        { version: '4', address: '198.18.0.5/24', interface: 0 },
        { version: '6', address: '2001:db8::5/64' },
      ]);
      expect(r.interfaces).toEqual([{ name: 'eth0', mac: '02:00:00:00:00:01', sandbox: '/var/run/netns/p' }]);
      expect(r.routes).toEqual([{ dst: '198.18.0.0/15' }]);
    }
  });
  it('same-format conversions only change cniVersion, and keep 1.1 fields for 1.x', () => {
    expect(convertResult(v040, '0.3.1')).toEqual({ ...v040, cniVersion: '0.3.1' });
    expect(convertResult(v110, '1.0.0')).toEqual({ ...v110, cniVersion: '1.0.0' });
    expect(convertResult(v110, '1.1.0')).toEqual(v110);
  });
  it('does not mutate its input', () => {
    const copy = structuredClone(v110);
    convertResult(v110, '0.3.0');
    expect(v110).toEqual(copy);
  });
  it('rejects what is not a result', () => {
    expect(codeOf(() => convertResult('x', '1.0.0'))).toBe(7);
    expect(codeOf(() => convertResult([], '1.0.0'))).toBe(7);
    expect(codeOf(() => convertResult({ ip4: { ip: '198.18.0.5/24' } }, '1.0.0'))).toBe(7);
    expect(codeOf(() => convertResult({ cniVersion: '0.2.0' }, '1.0.0'))).toBe(7);
    expect(codeOf(() => convertResult({ ips: [{}] }, '1.0.0'))).toBe(7);
    expect(codeOf(() => convertResult({ ips: 'x' }, '1.0.0'))).toBe(7);
    expect(codeOf(() => convertResult({ routes: [{ gw: '198.18.0.1' }] }, '1.0.0'))).toBe(7);
    expect(codeOf(() => convertResult({ ips: [{ version: '6', address: '198.18.0.5/24' }] }, '0.4.0'))).toBe(7);
    expect(codeOf(() => convertResult({ dns: [] }, '0.4.0'))).toBe(7);
  });
});

describe('parseNetConf', () => {
  it('accepts a config with meshcap and unknown keys', () => {
    const c = parseNetConf(conf({ agentSocket: '/run/m.sock', agentTimeoutMs: 2000, excludeNamespaces: ['kube-system'], custom: { a: 1 } }), 'ADD');
    expect(c.agentTimeoutMs).toBe(2000);
    expect(c.custom).toEqual({ a: 1 });
  });
  it('rejects bad JSON (6), bad versions (1), bad schema (7)', () => {
    expect(codeOf(() => parseNetConf('{', 'ADD'))).toBe(6);
    expect(codeOf(() => parseNetConf('[]', 'ADD'))).toBe(6);
    expect(codeOf(() => parseNetConf('null', 'ADD'))).toBe(6);
    expect(codeOf(() => parseNetConf(conf({}, '0.2.0'), 'ADD'))).toBe(1);
    expect(codeOf(() => parseNetConf(JSON.stringify({ name: 'n', type: 't' }), 'ADD'))).toBe(1);
    expect(codeOf(() => parseNetConf(JSON.stringify({ cniVersion: '1.0.0', type: 't' }), 'ADD'))).toBe(7);
    expect(codeOf(() => parseNetConf(JSON.stringify({ cniVersion: '1.0.0', name: 'n' }), 'ADD'))).toBe(7);
    expect(codeOf(() => parseNetConf(conf({ name: '-bad' }), 'ADD'))).toBe(7);
    expect(codeOf(() => parseNetConf(conf({ agentSocket: 'relative.sock' }), 'ADD'))).toBe(7);
    expect(codeOf(() => parseNetConf(conf({ agentTimeoutMs: 0 }), 'ADD'))).toBe(7);
    expect(codeOf(() => parseNetConf(conf({ agentTimeoutMs: 1.5 }), 'ADD'))).toBe(7);
    expect(codeOf(() => parseNetConf(conf({ excludeNamespaces: [1] }), 'ADD'))).toBe(7);
    expect(codeOf(() => parseNetConf(conf({ prevResult: [] }), 'ADD'))).toBe(7);
    expect(codeOf(() => parseNetConf(conf({ 'cni.dev/valid-attachments': [{ containerID: 'a' }] }), 'GC'))).toBe(7);
  });
  it('names the offending key', () => {
    expect(() => parseNetConf(conf({ agentTimeoutMs: 'soon' }), 'ADD')).toThrow(/agentTimeoutMs/);
  });
});

describe('env', () => {
  it('parses CNI_ARGS', () => {
    expect(parseCniArgs('IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;;K8S_POD_UID=a=b')).toEqual({
      IgnoreUnknown: '1', K8S_POD_NAMESPACE: 'ns', K8S_POD_NAME: 'p', K8S_POD_UID: 'a=b',
    });
    expect(parseCniArgs('')).toEqual({});
    expect(codeOf(() => parseCniArgs('novalue'))).toBe(4);
    expect(codeOf(() => parseCniArgs('=x'))).toBe(4);
  });
  it('validates container ids and interface names', () => {
    expect(() => validateContainerId('a1_b.c-d')).not.toThrow();
    expect(codeOf(() => validateContainerId(''))).toBe(4);
    expect(codeOf(() => validateContainerId('_a'))).toBe(4);
    expect(codeOf(() => validateContainerId('a/b'))).toBe(4);
    expect(() => validateIfname('eth0')).not.toThrow();
    for (const bad of ['', '.', '..', 'a/b', 'a:b', 'a b', 'x'.repeat(16)]) expect(codeOf(() => validateIfname(bad))).toBe(4);
  });
  it('reads GC attachments from either key', () => {
    const c = parseNetConf(conf({ 'cni.dev/valid-attachments': [{ containerID: 'c1', ifname: 'eth0' }] }), 'GC');
    expect(validAttachments(c)).toEqual([{ containerId: 'c1', ifname: 'eth0' }]);
    const old = parseNetConf(conf({ 'cni.dev/attachments': [{ containerID: 'c2', ifname: 'net1' }] }), 'GC');
    expect(validAttachments(old)).toEqual([{ containerId: 'c2', ifname: 'net1' }]);
    expect(validAttachments(parseNetConf(conf(), 'GC'))).toEqual([]);
  });
});

describe('parseRequest', () => {
  it('builds a CniRequest with pod identity from CNI_ARGS', () => {
    const p = parseRequest(raw({ stdin: conf({ prevResult: { cniVersion: '1.1.0' } }) }));
    if (p.command === 'VERSION') throw new Error('unexpected');
    expect(p.request).toMatchObject({
      command: 'ADD', containerId: 'abc123', netns: '/var/run/netns/pod1', ifname: 'eth0', cniVersion: '1.1.0',
      podNamespace: 'shop', podName: 'cart-1',
    });
    expect(p.request.args.K8S_POD_UID).toBe('u-1');
    expect(p.request.config.prevResult).toEqual({ cniVersion: '1.1.0' });
  });
  it('answers VERSION with or without stdin', () => {
    expect(parseRequest(raw({ command: 'VERSION', stdin: '' }))).toEqual({ command: 'VERSION', versionInfo: versionInfo() });
    expect(parseRequest(raw({ command: 'VERSION', stdin: '{"cniVersion":"0.3.1"}' }))).toMatchObject({ versionInfo: { cniVersion: '0.3.1' } });
    expect(codeOf(() => parseRequest(raw({ command: 'VERSION', stdin: '{' })))).toBe(6);
  });
  it('checks command and required env per verb', () => {
    expect(codeOf(() => parseRequest(raw({ command: '' })))).toBe(4);
    expect(codeOf(() => parseRequest(raw({ command: 'FROB' })))).toBe(4);
    expect(() => parseRequest(raw({ command: 'ADD', netns: '' }))).toThrow(/CNI_NETNS is not set/);
    expect(() => parseRequest(raw({ command: 'CHECK', containerId: '', ifname: '' }))).toThrow(/CNI_CONTAINERID, CNI_IFNAME are not set/);
    // DEL may come without a netns (already gone); STATUS and GC need no container.
    expect(parseRequest(raw({ command: 'DEL', netns: '' })).command).toBe('DEL');
    expect(parseRequest(raw({ command: 'STATUS', containerId: '', netns: '', ifname: '' })).command).toBe('STATUS');
    const gc = parseRequest(raw({ command: 'GC', containerId: '', netns: '', ifname: '', stdin: conf({ 'cni.dev/valid-attachments': [{ containerID: 'k', ifname: 'eth0' }] }) }));
    expect(gc).toMatchObject({ command: 'GC', validAttachments: [{ containerId: 'k', ifname: 'eth0' }] });
  });
  it('rejects bad stdin, versions, ids, args', () => {
    expect(codeOf(() => parseRequest(raw({ stdin: '' })))).toBe(6);
    expect(codeOf(() => parseRequest(raw({ stdin: 'not json' })))).toBe(6);
    expect(codeOf(() => parseRequest(raw({ stdin: conf({}, '0.2.0') })))).toBe(1);
    expect(codeOf(() => parseRequest(raw({ command: 'STATUS', stdin: conf({}, '1.0.0') })))).toBe(1);
    expect(codeOf(() => parseRequest(raw({ containerId: '../x' })))).toBe(4);
    expect(codeOf(() => parseRequest(raw({ ifname: 'eth0:1' })))).toBe(4);
    expect(codeOf(() => parseRequest(raw({ args: 'garbage' })))).toBe(4);
  });
  it('passes a netns that does not exist through unchecked', () => {
    const p = parseRequest(raw({ netns: '/proc/999999999/ns/net' }));
    expect(p.command === 'ADD' && p.request.netns).toBe('/proc/999999999/ns/net');
  });
});
