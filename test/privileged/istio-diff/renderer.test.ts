// meshcap's iptables renderer against the real istio-iptables (built by
// scripts/build-peers.sh from the pinned istio.io/istio): generated inputs,
// a fixed seed, byte-identical restore input or the same rejection
// (docs/istio-compat.md). `npm run test:istio-diff -- --seed S --runs N` runs
// more (ISTIO_DIFF_SEED / ISTIO_DIFF_RUNS here).
import { execFile } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { isIP } from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { projectRoot } from '../../../src/paths.js';
import { createPeerNetns, istioVersion, makeWorkDir, requirePeers, runIstioIptables, type PeerNetns } from '../../helpers/istio-peers.js';
import { describeCase, generateFlagCases, meshcapRender, runFlagDiff } from '../../helpers/istio-diff/renderer-diff.js';
import { resolvConf } from '../../helpers/istio-diff/flag-cases.js';
import type { RendererVector } from '../../unit/fallback-iptables/istio-diff-vectors.test.js';
import { scaled } from '../../helpers/lab.js';

const SEED = Number(process.env.ISTIO_DIFF_SEED ?? 20261124);
const RUNS = Number(process.env.ISTIO_DIFF_RUNS ?? 2000);

describe(`renderer vs istio-iptables (istio.io/istio ${istioVersion()})`, () => {
  let netns: PeerNetns;
  let work: ReturnType<typeof makeWorkDir>;
  beforeAll(() => {
    requirePeers();
    netns = createPeerNetns();
    work = makeWorkDir();
  });
  afterAll(() => {
    netns?.close();
    work?.close();
  });

  it(`${RUNS} generated cases (seed ${SEED}): identical rules or the same rejection`, async () => {
    // long runs (npm run test:istio-diff) report progress every 5,000 cases
    let done = 0;
    let differ = 0;
    const progress = process.env.ISTIO_DIFF_PROGRESS ? (r: { identical: boolean }) => {
      if (!r.identical) differ++;
      if (++done % 5000 === 0) process.stderr.write(`istio-diff renderer: ${done} of ${RUNS} cases so far, ${done - differ} identical, ${differ} differ\n`);
    } : undefined;
    const s = await runFlagDiff(generateFlagCases(SEED, RUNS), netns, work.dir, 2, progress);
    const report = s.differences.slice(0, 10).map((d) => `#${d.index} ${describeCase(d.input)}\n  ${d.detail}`).join('\n\n');
    const line = `${s.cases} cases, ${s.identical} identical, ${s.differ} differ`;
    console.log(`istio-diff renderer: seed ${SEED}, ${(s.ms / 1000).toFixed(1)} s, ${s.bothRejected} rejected by both\n${report}${report ? '\n' : ''}${line}`);
    if (process.env.ISTIO_DIFF_SUMMARY) writeFileSync(process.env.ISTIO_DIFF_SUMMARY, JSON.stringify({ kind: 'renderer', seed: SEED, cases: s.cases, identical: s.identical, differ: s.differ, ms: s.ms, bothRejected: s.bothRejected }));
    expect(s.cases).toBe(RUNS);
    expect(s.differ, `${s.differ} of ${s.cases} cases differ from istio-iptables:\n\n${report}`).toBe(0);
  }, Math.max(900_000, RUNS * 200));

  it('the recorded vectors (test/fixtures/istio-diff/renderer-vectors.json) are still what this istio-iptables prints', async () => {
    const file = JSON.parse(readFileSync(path.join(projectRoot, 'test/fixtures/istio-diff/renderer-vectors.json'), 'utf8')) as { istio: string; vectors: RendererVector[] };
    expect(file.istio).toBe(istioVersion());
    for (const v of file.vectors) {
      const dns = v.input.args.some((a) => a.startsWith('--redirect-dns'));
      const r = await runIstioIptables({ args: v.input.args, env: v.input.env, netns: netns.path[v.input.family], resolvConf: dns ? resolvConf(v.input) : undefined }, work.dir);
      expect({ name: v.name, status: r.status === 0 ? 0 : 'non-zero', v4: r.v4, v6: r.v6 }).toEqual({ name: v.name, status: v.istio.status === 0 ? 0 : 'non-zero', v4: v.istio.v4, v6: v.istio.v6 });
    }
  }, scaled(120_000));

  it('the meshcap CLI prints what the library renders, and fails where it throws (12 generated cases)', async () => {
    const cli = path.join(projectRoot, 'bin', 'meshcap');
    for (const c of generateFlagCases(SEED + 1, 12)) {
      const lib = meshcapRender(c);
      const servers = c.nameservers.filter((n) => isIP(n));
      const argv = [...c.args, `--dns-servers-v4=${servers.filter((n) => isIP(n) === 4).join(',')}`, `--dns-servers-v6=${servers.filter((n) => isIP(n) === 6).join(',')}`, '--family', '4'];
      const r = await new Promise<{ code: number; out: string }>((resolve) => {
        execFile(process.execPath, [cli, 'iptables', 'render', ...argv], { env: { PATH: process.env.PATH ?? '', ...c.env } }, (err, stdout) =>
          resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, out: stdout }));
      });
      const label = describeCase(c);
      if (!lib.ok) {
        expect(r.code, label).not.toBe(0);
        continue;
      }
      expect(r.code, label).toBe(0);
      // the library's servers are Istio's split only with DNS redirection on; the CLI passes them through the same rule
      if (lib.v4 !== null) expect(r.out, label).toBe(lib.v4);
    }
  }, scaled(120_000));
});
