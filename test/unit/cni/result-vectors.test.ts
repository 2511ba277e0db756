// One definition of the prevResult conversion, two implementations: the
// agent's convertResult (src/cni/result.ts) answers every ADD it serves, the
// C forwarder's result_convert (native/cni/src/result_convert.c) answers an
// excluded-namespace ADD while the agent is down and checks every ADD result
// it relays. Both must turn each prevResult of
// test/fixtures/cni/result-conversion.json into exactly the expected result
// of each version, or refuse it with exactly the expected CNI error.
import { spawnSync } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CniError } from '../../../src/cni/errors.js';
import { convertResult } from '../../../src/cni/result.js';
import { SUPPORTED_VERSIONS, type CniVersion } from '../../../src/cni/rules.js';
import { cniBinary, projectRoot } from '../../../src/paths.js';

interface Vector { name: string; prevResult: unknown; expect: Record<CniVersion, Record<string, unknown> | { error: { code: number; msg: string } }> }
const { vectors } = JSON.parse(readFileSync(path.join(projectRoot, 'test/fixtures/cni/result-conversion.json'), 'utf8')) as { vectors: Vector[] };

function ts(prev: unknown, v: CniVersion): unknown {
  try {
    return convertResult(prev, v);
  } catch (e) {
    if (!(e instanceof CniError)) throw e;
    return { error: { code: e.code, msg: e.message } };
  }
}

let tmp: string;
beforeAll(() => {
  tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-result-vectors-'));
});
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** The forwarder's own answer: ADD in an excluded namespace, no agent at the socket. */
function c(prev: unknown, v: CniVersion): unknown {
  const file = path.join(tmp, 'stdin.json');
  writeFileSync(file, JSON.stringify({
    cniVersion: v, name: 'vectors', type: 'meshcap-cni', agentSocket: path.join(tmp, 'no-agent.sock'),
    excludeNamespaces: ['excluded'], ...(prev === null ? {} : { prevResult: prev }),
  }));
  const fd = openSync(file, 'r');
  try {
    const r = spawnSync(cniBinary, [], {
      env: { CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'c1', CNI_NETNS: '/var/run/netns/x', CNI_IFNAME: 'eth0', CNI_ARGS: 'K8S_POD_NAMESPACE=excluded;K8S_POD_NAME=p' },
      stdio: [fd, 'pipe', 'pipe'], encoding: 'utf8', timeout: 10_000,
    });
    if (r.error) throw r.error;
    const out = JSON.parse(r.stdout) as Record<string, unknown>;
    if (r.status === 0) return out;
    expect(out.cniVersion, 'an error carries the config version').toBe(v);
    return { error: { code: out.code, msg: out.msg } };
  } finally {
    closeSync(fd);
  }
}

describe('prevResult conversion: the agent and the forwarder against one vector file', () => {
  it('has vectors for results and for refusals', () => {
    expect(vectors.length).toBeGreaterThan(30);
    const all = vectors.flatMap((x) => Object.values(x.expect));
    expect(all.filter((e) => 'error' in e).length).toBeGreaterThan(20);
    expect(all.filter((e) => !('error' in e)).length).toBeGreaterThan(40);
  });

  it('the agent (convertResult) produces every expectation; every result it gives is a fixed point (what the forwarder relays)', () => {
    for (const x of vectors) {
      for (const v of SUPPORTED_VERSIONS) {
        expect(ts(x.prevResult, v), `${x.name} -> ${v}`).toEqual(x.expect[v]);
        if (!('error' in x.expect[v])) expect(convertResult(x.expect[v], v), `${x.name} -> ${v} again`).toEqual(x.expect[v]);
      }
    }
  });

  it('the forwarder (result_convert) produces every expectation', () => {
    expect(existsSync(cniBinary), `${cniBinary} is missing: run npm run setup`).toBe(true);
    for (const x of vectors) {
      for (const v of SUPPORTED_VERSIONS) expect(c(x.prevResult, v), `${x.name} -> ${v}`).toEqual(x.expect[v]);
    }
  });
});
