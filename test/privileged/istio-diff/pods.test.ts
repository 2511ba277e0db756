// meshcap's meshed-pod decision and pod-to-rules path against istio-cni's own
// ADD path (istio-cni-decide, built by scripts/build-peers.sh from the pinned
// istio.io/istio): generated pods, a fixed seed, the same decision by
// category, and for redirected pods the same rules byte for byte
// (docs/istio-compat.md). ISTIO_DIFF_SEED / ISTIO_DIFF_POD_RUNS run more.
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { projectRoot } from '../../../src/paths.js';
import { createPeerNetns, ISTIO_CNI, istioVersion, IstioCniDecider, requirePeers, type PeerNetns } from '../../helpers/istio-peers.js';
import { describePod, diffPod, generatePodCases, istioCategory, runPodDiff } from '../../helpers/istio-diff/pod-diff.js';
import type { PodVector } from '../../unit/decision/istio-diff-pod-vectors.test.js';
import { scaled } from '../../helpers/lab.js';

const SEED = Number(process.env.ISTIO_DIFF_SEED ?? 20261124);
const RUNS = Number(process.env.ISTIO_DIFF_POD_RUNS ?? 2000);

describe(`meshed-pod decision vs istio-cni (istio.io/istio ${istioVersion()})`, () => {
  let netns: PeerNetns;
  let decider: IstioCniDecider;
  beforeAll(() => {
    requirePeers();
    netns = createPeerNetns();
    decider = new IstioCniDecider();
  });
  afterAll(() => {
    decider?.close();
    netns?.close();
  });

  it(`${RUNS} generated pods (seed ${SEED}): the same decision, and the same rules when redirected`, async () => {
    const s = await runPodDiff(generatePodCases(SEED, RUNS), decider, netns);
    const report = s.differences.slice(0, 10).map((d) => `#${d.index} ${describePod(d.input)}\n  ${d.detail}`).join('\n\n');
    const line = `${s.cases} cases, ${s.identical} identical, ${s.differ} differ`;
    console.log(`istio-diff pods: seed ${SEED}, ${(s.ms / 1000).toFixed(1)} s, decisions ${JSON.stringify(s.categories)}\n${report}${report ? '\n' : ''}${line}`);
    if (process.env.ISTIO_DIFF_SUMMARY) writeFileSync(`${process.env.ISTIO_DIFF_SUMMARY}.pods`, JSON.stringify({ kind: 'pods', seed: SEED, cases: s.cases, identical: s.identical, differ: s.differ, ms: s.ms, categories: s.categories }));
    expect(s.cases).toBe(RUNS);
    // every category is exercised (in a run of any size), so a generator that stops producing one is noticed
    if (RUNS >= 1000) for (const c of ['redirect', 'namespace-excluded', 'istio-init', 'disable-envoy', 'no-istio-proxy', 'proxy-type', 'inject-disabled', 'not-injected', 'error'] as const) {
      expect(s.categories[c] ?? 0, `no generated pod ended as ${c}`).toBeGreaterThan(0);
    }
    expect(s.differ, `${s.differ} of ${s.cases} pods differ from istio-cni:\n\n${report}`).toBe(0);
  }, scaled(600_000));

  it('the recorded pod vectors (test/fixtures/istio-diff/pod-vectors.json) are still what this istio-cni decides', async () => {
    const file = JSON.parse(readFileSync(path.join(projectRoot, 'test/fixtures/istio-diff/pod-vectors.json'), 'utf8')) as { istio: string; vectors: PodVector[] };
    expect(file.istio).toBe(istioVersion());
    for (const v of file.vectors) {
      const a = await decider.decide({ namespace: v.input.namespace, name: 'p', pod: v.input.pod, netns: netns.path[v.input.family], excludeNamespaces: v.input.excludeNamespaces });
      expect({ name: v.name, category: istioCategory(a).category, v4: a.v4, v6: a.v6 }).toEqual({ name: v.name, category: v.istio.category, v4: v.istio.v4, v6: v.istio.v6 });
      // and meshcap agrees, through the same comparison as the generated pods
      const r = await diffPod(0, v.input, decider, netns);
      expect(r.identical, `${v.name}: ${r.detail}`).toBe(true);
    }
  }, scaled(120_000));

  it('the istio-cni plugin binary is built from the pinned version (it answers VERSION, and names the version run by hand)', () => {
    const v = JSON.parse(execFileSync(ISTIO_CNI, [], { input: '{}', env: { CNI_COMMAND: 'VERSION' }, encoding: 'utf8' })) as { supportedVersions: string[] };
    expect(v.supportedVersions).toContain('1.0.0');
    const run = spawnSync(ISTIO_CNI, [], { env: {}, encoding: 'utf8' });
    const about = run.stdout + run.stderr;
    expect(about).toContain(`CNI plugin istio-cni ${istioVersion()}`);
  });
});
