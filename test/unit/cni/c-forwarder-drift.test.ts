// The CNI rules exist twice: in src/cni/ for the agent, and in C in
// meshcap-cni, which answers VERSION, checks the env and the version itself,
// and converts prevResult when the agent is down. This test fails when the two
// drift apart. It reads the C tables for what only C lists, and runs the built
// binary (no root and no agent needed: an agent socket that does not exist
// triggers the forwarder's own answers) to compare its behaviour with the
// TypeScript functions for every verb, version and missing variable.
import { spawnSync } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CniError, errorVersion } from '../../../src/cni/errors.js';
import { parseRequest, type RawRequest } from '../../../src/cni/request.js';
import { convertResult } from '../../../src/cni/result.js';
import {
  AGENT_SOCKET_MAX_LENGTH,
  AGENT_TIMEOUT_MAX_MS,
  CNI_ERROR_CODES,
  CNI_VERBS,
  LATEST_VERSION,
  REQUIRED_ENV,
  SUPPORTED_VERSIONS,
  VERB_MIN_VERSION,
  type CniCommand,
} from '../../../src/cni/rules.js';
import { versionInfo } from '../../../src/cni/versions.js';
import { cniBinary, projectRoot } from '../../../src/paths.js';

const csrc = (f: string) => readFileSync(path.join(projectRoot, 'native/cni/src', f), 'utf8');

interface CVerb { name: string; minVersion: string; needsContainer: boolean; needsNetns: boolean }

/** The verbs[] table of main.c. */
function cVerbs(): CVerb[] {
  const table = /verbs\[\]\s*=\s*\{([\s\S]*?)\};/.exec(csrc('main.c'))?.[1] ?? '';
  return [...table.matchAll(/\{"(\w+)",\s*V_\w+,\s*"([\d.]+)",\s*([01]),\s*([01])\}/g)]
    .map((m) => ({ name: m[1]!, minVersion: m[2]!, needsContainer: m[3] === '1', needsNetns: m[4] === '1' }));
}

const EXCLUDED_NS = 'meshcap-drift-excluded';
let tmp: string;
let deadSocket: string;

interface Run { exitCode: number | null; out: Record<string, unknown> }

/**
 * Runs meshcap-cni with exactly this env (no inherited CNI_*) and stdin. The
 * stdin is a file, as a runtime's is written at once: a pipe would get EPIPE
 * from a forwarder that refuses the env before it reads.
 */
function runCni(env: Record<string, string>, stdin: string): Run {
  const file = path.join(tmp, 'stdin.json');
  writeFileSync(file, stdin);
  const fd = openSync(file, 'r');
  try {
    const r = spawnSync(cniBinary, [], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env }, stdio: [fd, 'pipe', 'pipe'], encoding: 'utf8', timeout: 10_000 });
    if (r.error) throw r.error;
    return { exitCode: r.status, out: r.stdout.trim() === '' ? {} : JSON.parse(r.stdout) as Record<string, unknown> };
  } finally {
    closeSync(fd);
  }
}

const fullEnv = (command: string): Record<string, string> => ({
  CNI_COMMAND: command,
  CNI_CONTAINERID: 'c0ffee',
  CNI_NETNS: '/var/run/netns/drift',
  CNI_IFNAME: 'eth0',
  CNI_ARGS: `K8S_POD_NAMESPACE=${EXCLUDED_NS};K8S_POD_NAME=p`,
});
const netconf = (cniVersion: string, extra: Record<string, unknown> = {}) =>
  JSON.stringify({ cniVersion, name: 'drift', type: 'meshcap-cni', agentSocket: deadSocket, agentTimeoutMs: 2000, ...extra });
const rawOf = (env: Record<string, string>, stdin: string): RawRequest => ({
  command: env.CNI_COMMAND ?? '',
  containerId: env.CNI_CONTAINERID ?? '',
  netns: env.CNI_NETNS ?? '',
  ifname: env.CNI_IFNAME ?? '',
  args: env.CNI_ARGS ?? '',
  path: '',
  stdin,
});
/** What the agent's parseRequest says about a request: ok, or its CniError code and message. */
function tsVerdict(raw: RawRequest): { code: number; msg: string } | 'ok' {
  try {
    parseRequest(raw);
    return 'ok';
  } catch (e) {
    if (!(e instanceof CniError)) throw e;
    return { code: e.code, msg: e.message };
  }
}

beforeAll(() => {
  tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-cni-drift-'));
  deadSocket = path.join(tmp, 'no-agent.sock');
});
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

describe('C forwarder and src/cni agree', () => {
  it('the forwarder is built', () => {
    expect(existsSync(cniBinary), `${cniBinary} is missing: run npm run setup`).toBe(true);
  });

  it('the C tables list the same verbs, minimum versions, required env, versions and codes', () => {
    const verbs = cVerbs();
    expect(verbs.map((v) => v.name).sort()).toEqual([...CNI_VERBS, 'VERSION'].sort());
    for (const v of verbs) {
      expect(v.minVersion, `minimum version of ${v.name}`).toBe(VERB_MIN_VERSION[v.name as CniCommand | 'VERSION']);
      if (v.name === 'VERSION') continue;
      const env = REQUIRED_ENV[v.name as CniCommand];
      expect(env.includes('CNI_CONTAINERID') && env.includes('CNI_IFNAME'), `${v.name} needs_container`).toBe(v.needsContainer);
      expect(env.includes('CNI_NETNS'), `${v.name} needs_netns`).toBe(v.needsNetns);
    }
    const versions = /cni_supported_versions\[\]\s*=\s*\{([^}]*)\}/.exec(csrc('cni_error.c'))?.[1] ?? '';
    expect([...versions.matchAll(/"([\d.]+)"/g)].map((m) => m[1])).toEqual([...SUPPORTED_VERSIONS]);
    expect(/#define CNI_LATEST_VERSION "([\d.]+)"/.exec(csrc('cni_error.h'))?.[1]).toBe(LATEST_VERSION);
    const codes = [...csrc('cni_error.h').matchAll(/CNI_ERR_\w+ = (\d+)/g)].map((m) => Number(m[1]));
    expect(codes.length).toBeGreaterThan(5);
    for (const c of codes) expect(Object.values(CNI_ERROR_CODES), `C error code ${c}`).toContain(c);
    expect(Number(/MESHCAP_MAX_AGENT_TIMEOUT_MS (\d+)/.exec(csrc('cni_config.h'))?.[1])).toBe(AGENT_TIMEOUT_MAX_MS);
    expect(Number(/json_string_length\(s\) > (\d+)/.exec(csrc('cni_config.c'))?.[1])).toBe(AGENT_SOCKET_MAX_LENGTH);
  });

  it('VERSION answers the same for every requested version', () => {
    for (const requested of [...SUPPORTED_VERSIONS, '0.2.0', '2.0.0', 'x']) {
      const r = runCni({ CNI_COMMAND: 'VERSION' }, JSON.stringify({ cniVersion: requested }));
      expect(r.exitCode).toBe(0);
      expect(r.out, `VERSION for ${requested}`).toEqual(versionInfo(requested));
    }
    expect(runCni({ CNI_COMMAND: 'VERSION' }, '').out).toEqual(versionInfo(undefined));
  });

  it('an unknown verb, and every combination of missing required variables, gets the same error', () => {
    // (No CNI_COMMAND at all is not an error for the forwarder: run by hand it
    // prints its about text and exits 0, as the reference plugins do; the
    // agent never sees such a request. test/privileged/cni/contract.test.ts.)
    const cases: Record<string, string>[] = [{ ...fullEnv('FROB') }];
    for (const verb of CNI_VERBS) {
      const vars = REQUIRED_ENV[verb];
      for (let mask = 1; mask < 1 << vars.length; mask++) {
        const env = fullEnv(verb);
        vars.forEach((v, i) => { if (mask & (1 << i)) delete env[v]; });
        cases.push(env);
      }
    }
    for (const env of cases) {
      const stdin = netconf(LATEST_VERSION);
      const r = runCni(env, stdin);
      const ts = tsVerdict(rawOf(env, stdin));
      expect(ts, JSON.stringify(env)).not.toBe('ok');
      expect(r.exitCode).toBe(1);
      expect({ code: r.out.code, msg: r.out.msg }, JSON.stringify(env)).toEqual(ts);
    }
  });

  it('every verb at every version (and unsupported ones): refused alike, or passed on alike', () => {
    for (const verb of CNI_VERBS) {
      for (const v of [...SUPPORTED_VERSIONS, '0.2.0', '9.9.9', '1.1.0-rc1']) {
        const env = fullEnv(verb);
        const stdin = netconf(v, { excludeNamespaces: [EXCLUDED_NS] });
        const r = runCni(env, stdin);
        const ts = tsVerdict(rawOf(env, stdin));
        const label = `${verb} at ${v}`;
        if (ts === 'ok') {
          // past the version checks the forwarder contacts the (absent) agent: no version error
          expect(r.out.code, label).not.toBe(CNI_ERROR_CODES.INCOMPATIBLE_VERSION);
        } else {
          expect(ts.code, label).toBe(CNI_ERROR_CODES.INCOMPATIBLE_VERSION);
          expect({ code: r.out.code, msg: r.out.msg, cniVersion: r.out.cniVersion }, label)
            .toEqual({ ...ts, cniVersion: errorVersion(v) });
        }
      }
    }
  });

  // The forwarder converts prevResult itself only for an excluded namespace
  // while the agent is down; the agent's convertResult does it otherwise. Both
  // must print the same result. (Malformed prevResults, and the exact
  // messages: result-vectors.test.ts, against a shared vector file.)
  const results: [string, Record<string, unknown> | undefined][] = [
    ['none', undefined],
    ['1.0 v4 + v6', {
      cniVersion: '1.0.0',
      interfaces: [{ name: 'eth0', mac: '0a:58:0a:f4:00:05', sandbox: '/var/run/netns/x' }],
      ips: [{ address: '10.244.0.5/24', gateway: '10.244.0.1', interface: 0 }, { address: 'fd00::5/64', interface: 0 }],
      routes: [{ dst: '0.0.0.0/0' }],
      dns: { nameservers: ['10.96.0.10'] },
    }],
    ['0.4 with versions', { cniVersion: '0.4.0', ips: [{ version: '4', address: '10.244.0.6/24' }, { version: '6', address: 'fd00::6/64' }] }],
    ['1.1 fields', {
      cniVersion: '1.1.0',
      interfaces: [{ name: 'eth0', mtu: 1450, socketPath: '/run/x.sock', pciID: '0000:00:01.0' }],
      ips: [{ address: '10.244.0.7/24', interface: 0 }],
      routes: [{ dst: '10.0.0.0/8', gw: '10.244.0.1', mtu: 1400, advmss: 1360, priority: 10, table: 100, scope: 0 }],
    }],
    ['no cniVersion, extra keys', { ips: [{ address: '198.18.0.9/32' }], custom: { kept: true } }],
  ];
  for (const [name, prev] of results) {
    it(`ADD in an excluded namespace with the agent down: prevResult "${name}" converts alike to every version`, () => {
      for (const v of SUPPORTED_VERSIONS) {
        const r = runCni(fullEnv('ADD'), netconf(v, { excludeNamespaces: [EXCLUDED_NS], ...(prev ? { prevResult: prev } : {}) }));
        expect(r.exitCode, JSON.stringify(r.out)).toBe(0);
        expect(r.out, `to ${v}`).toEqual(convertResult(prev, v));
      }
    });
  }
});
