// The chain runner against small plugin programs (the real bridge/host-local/
// meshcap-cni chain runs in test/privileged/sandbox): order, prevResult,
// environment, DEL in reverse past a failure, CNI error JSON.
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { chainAdd, chainDel, CniPluginError, resultIPv4, type ConfList } from '../../../src/sandbox/cni-chain.js';
import { hostPort } from '../../../src/sandbox/workload.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'mc-cni-chain-'));
const log = path.join(dir, 'calls.jsonl');
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A plugin that logs its call and answers its prevResult, or a fixed result, or a CNI error. */
function plugin(name: string, behaviour: 'ipam' | 'pass' | 'fail') {
  const p = path.join(dir, name);
  writeFileSync(p, `#!${process.execPath}
const fs = require('fs');
const conf = JSON.parse(fs.readFileSync(0, 'utf8'));
const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => k.startsWith('CNI_')));
fs.appendFileSync(${JSON.stringify(log)}, JSON.stringify({ name: ${JSON.stringify(name)}, env, conf }) + '\\n');
if (${JSON.stringify(behaviour)} === 'fail') { console.log(JSON.stringify({ cniVersion: '1.0.0', code: 11, msg: 'agent unreachable', details: 'socket gone' })); process.exit(1); }
if (process.env.CNI_COMMAND === 'DEL') process.exit(0);
console.log(JSON.stringify(${JSON.stringify(behaviour)} === 'ipam' ? { cniVersion: '1.0.0', ips: [{ address: '198.18.7.9/24' }] } : conf.prevResult));
`);
  chmodSync(p, 0o755);
}
plugin('ipam', 'ipam');
plugin('pass', 'pass');
plugin('broken', 'fail');

const calls = () => readFileSync(log, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { name: string; env: Record<string, string>; conf: Record<string, unknown> });
const rt = { containerId: 'c1', netns: '/var/run/netns/x', ifname: 'eth0', args: 'IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p', paths: ['/nonexistent', dir], timeoutMs: 30_000 };
const list = (...types: string[]): ConfList => ({ cniVersion: '1.0.0', name: 'net', plugins: types.map((type) => ({ type, extra: type })) });

describe('sandbox CNI chain runner', () => {
  it('ADD runs the plugins in order, each with the previous result and the runtime environment', async () => {
    writeFileSync(log, '');
    const r = await chainAdd(list('ipam', 'pass'), rt);
    expect(resultIPv4(r)).toBe('198.18.7.9');
    const [a, b] = calls();
    expect(a!.name).toBe('ipam');
    expect(a!.conf).toEqual({ type: 'ipam', extra: 'ipam', name: 'net', cniVersion: '1.0.0' });
    expect(b!.conf.prevResult).toEqual({ cniVersion: '1.0.0', ips: [{ address: '198.18.7.9/24' }] });
    expect(b!.env).toEqual({ CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'c1', CNI_NETNS: '/var/run/netns/x', CNI_IFNAME: 'eth0', CNI_ARGS: rt.args, CNI_PATH: `/nonexistent:${dir}` });
  });

  it('ADD stops at a failing plugin with its CNI error', async () => {
    writeFileSync(log, '');
    const e = await chainAdd(list('ipam', 'broken', 'pass'), rt).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(CniPluginError);
    expect((e as Error).message).toBe('CNI ADD failed in plugin broken (code 11): agent unreachable: socket gone');
    expect(calls().map((c) => c.name)).toEqual(['ipam', 'broken']);
  });

  it('DEL runs in reverse with the ADD result, past a failure, and throws the first', async () => {
    writeFileSync(log, '');
    const added = { cniVersion: '1.0.0', ips: [{ address: '198.18.7.9/24' }] };
    await expect(chainDel(list('ipam', 'broken', 'pass'), rt, added)).rejects.toThrow(/plugin broken/);
    const c = calls();
    expect(c.map((x) => x.name)).toEqual(['pass', 'broken', 'ipam']);
    for (const x of c) {
      expect(x.env.CNI_COMMAND).toBe('DEL');
      expect(x.conf.prevResult).toEqual(added);
    }
  });

  it('names a missing plugin and how to install it', async () => {
    await expect(chainAdd(list('bridge-that-is-not-there'), rt)).rejects.toThrow(/no executable bridge-that-is-not-there in \/nonexistent:.*apt-get install containernetworking-plugins/);
  });

  it('a result without IPv4 is an error naming the result', () => {
    expect(() => resultIPv4({ ips: [{ address: '2001:db8::5/64' }] })).toThrow(/no IPv4 address/);
  });

  it('workload targets are HOST:PORT', () => {
    expect(hostPort('198.19.1.2:8080')).toEqual({ host: '198.19.1.2', port: 8080 });
    expect(hostPort('[2001:db8::1]:80')).toEqual({ host: '2001:db8::1', port: 80 });
    expect(() => hostPort('198.19.1.2')).toThrow(/not HOST:PORT/);
    expect(() => hostPort('h:70000')).toThrow(/not HOST:PORT/);
  });
});
