// 100 pods at once, as a node starting a burst of pods sees it: 100 network
// namespaces (no links: state, not traffic, is under test), 100 concurrent
// meshcap-cni ADDs, then 100 concurrent DELs. No error, every pod's state
// present after ADD and gone after DEL, within a time box.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { pino } from 'pino';
import { stringify } from 'yaml';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { describeEbpf } from '../../helpers/datapaths.js';
import { startAgent, type Agent } from '../../../src/agent/agent.js';
import { configOf, cookieOf } from '../../../src/agent/state-store.js';
import { FileSource } from '../../../src/kube/file-source.js';
import { uninstallDatapath } from '../../../src/loader/datapath.js';
import { Lab, scaled, testPinRoot } from '../../helpers/lab.js';
import { istioPod } from '../../helpers/pods.js';
import { cni, requireCniBinary } from './cni-harness.js';

const N = 100;

describeEbpf('100 concurrent ADDs then 100 DELs (eBPF mode)', () => {
  const lab = new Lab();
  const pinRoot = testPinRoot();
  let tmp: string;
  let agent: Agent;
  let socket: string;
  const nss: { name: string; path: string }[] = [];

  beforeAll(async () => {
    requireCniBinary();
    tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-burst-'));
    const podsFile = path.join(tmp, 'pods.yaml');
    writeFileSync(podsFile, Array.from({ length: N }, (_, i) => stringify(istioPod({ name: `burst-${i}` }))).join('---\n'));
    for (let i = 0; i < N; i++) nss.push(await lab.netns(`b${i}`));
    socket = path.join(tmp, 'cni.sock');
    const logger = pino({ level: 'warn' });
    agent = await startAgent({
      socketPath: socket, pinRoot, mode: 'ebpf', stateDir: path.join(tmp, 'state'),
      podSource: new FileSource({ path: podsFile, logger }), excludeNamespaces: [], logger, podWaitMs: 2000,
    });
  }, scaled(120_000));

  afterAll(async () => {
    await agent?.close();
    await lab.cleanup();
    uninstallDatapath(pinRoot);
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  const call = (i: number) => ({
    socket, containerId: `burst${i}`, netns: nss[i]!.path, pod: `burst-${i}`,
    podAddress: `198.18.${20 + Math.floor(i / 250)}.${(i % 250) + 1}/16`,
  });

  it('every ADD succeeds and every pod\'s state is present; every DEL succeeds and it is gone', async () => {
    const t0 = performance.now();
    const adds = await Promise.all(nss.map((_, i) => cni('ADD', call(i))));
    const addMs = performance.now() - t0;
    const failed = adds.map((r, i) => [i, r] as const).filter(([, r]) => r.exitCode !== 0);
    expect(failed.map(([i, r]) => `${i}: ${r.stdout}`)).toEqual([]);

    expect(agent.store.list()).toHaveLength(N);
    const cookies = new Set<bigint>();
    for (let i = 0; i < N; i++) {
      const rec = agent.store.get(`burst${i}`, 'eth0')!;
      expect(rec.podName).toBe(`burst-${i}`);
      const cookie = cookieOf(rec)!;
      cookies.add(cookie);
      expect(agent.ebpf!.checkEntries(cookie, configOf(rec), rec.podIPs)).toEqual([]);
    }
    expect(cookies.size).toBe(N);
    expect(new Set(agent.ebpf!.pods())).toEqual(cookies);

    const t1 = performance.now();
    const dels = await Promise.all(nss.map((_, i) => cni('DEL', call(i))));
    const delMs = performance.now() - t1;
    expect(dels.filter((r) => r.exitCode !== 0).map((r) => r.stdout)).toEqual([]);
    expect(agent.store.list()).toHaveLength(0);
    for (const c of cookies) expect(agent.ebpf!.leftovers(c)).toBe(0);
    expect(agent.ebpf!.pods()).toEqual([]);
    const { stdout } = await execa('ls', [path.join(tmp, 'state')]);
    expect(stdout).toBe('');

    console.log(`${N} concurrent ADDs: ${addMs.toFixed(0)} ms, ${N} concurrent DELs: ${delMs.toFixed(0)} ms`);
    // time box: generous for a loaded 2-core machine, far below a runtime's patience
    expect(addMs).toBeLessThan(30_000);
    expect(delMs).toBeLessThan(30_000);
  }, scaled(120_000));
});
