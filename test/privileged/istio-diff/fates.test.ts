// Rules applied, not just text (docs/istio-compat.md, "Fates"): generated
// capture configs applied by the real istio-iptables, by meshcap's iptables
// mode and by meshcap's eBPF mode in three pod netns, the same connection
// matrix through each, the same fate and original destination for every
// connection. eBPF mode's documented differences are named (ebpfRefusal in
// test/helpers/istio-diff/fates.ts) and asserted, never skipped.
// ISTIO_DIFF_SEED / ISTIO_DIFF_FATE_RUNS run more (npm run test:istio-diff).
import { writeFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { istioVersion, requirePeers } from '../../helpers/istio-peers.js';
import { Lab, scaled } from '../../helpers/lab.js';
import { describeEbpf } from '../../helpers/datapaths.js';
import { connectionMatrix, createPods, DOCUMENTED_REFUSALS, EBPF_CONN_ALLOWANCES, runConfig, type ConfigResult, type PodUnderTest, type Variant } from '../../helpers/istio-diff/fates.js';
import { generateFateCases } from '../../helpers/istio-diff/fate-cases.js';
import { describeCase } from '../../helpers/istio-diff/renderer-diff.js';

const SEED = Number(process.env.ISTIO_DIFF_SEED ?? 20261124);
const RUNS = Number(process.env.ISTIO_DIFF_FATE_RUNS ?? 40);

describeEbpf(`connection fates: istio-iptables vs meshcap iptables and eBPF modes (istio.io/istio ${istioVersion()})`, () => {
  const lab = new Lab();
  let pods: Record<Variant, PodUnderTest> | undefined;
  beforeAll(async () => {
    requirePeers();
    pods = createPods(lab);
    for (const p of Object.values(pods)) await p.setup();
  }, scaled(180_000));
  afterAll(async () => {
    for (const p of Object.values(pods ?? {})) await p.close().catch(() => undefined);
    await lab.cleanup();
  });

  it(`${RUNS} generated configs (seed ${SEED}): every connection meets the same fate with the same original destination`, async () => {
    const conns = connectionMatrix();
    const cases = generateFateCases(SEED, RUNS);
    const start = Date.now();
    const results: ConfigResult[] = [];
    for (const [i, c] of cases.entries()) {
      const r = await runConfig(i, c, pods!, conns);
      results.push(r);
      if (process.env.ISTIO_DIFF_PROGRESS && (i + 1) % 10 === 0) process.stderr.write(`istio-diff fates: ${i + 1} of ${RUNS} configs\n`);
    }
    const ms = Date.now() - start;
    const bad = results.filter((r) => r.iptablesDiffers.length || r.ebpfDiffers.length);
    const report = bad.slice(0, 8).map((r) => `#${r.index} ${describeCase(r.input)}\n  ${[...r.iptablesDiffers, ...r.ebpfDiffers].slice(0, 12).join('\n  ')}`).join('\n\n');
    const sum = (k: 'istioFates' | 'allowed') => results.reduce<Record<string, number>>((acc, r) => {
      for (const [n, v] of Object.entries(r[k])) acc[n] = (acc[n] ?? 0) + v;
      return acc;
    }, {});
    const fates = sum('istioFates');
    const allowed = sum('allowed');
    const connections = results.length * conns.length;
    const line = `${results.length} configs, ${connections} connections per mode, ${results.length - bad.length} configs identical, ${bad.length} differ`;
    console.log(`istio-diff fates: seed ${SEED}, ${(ms / 1000).toFixed(1)} s, ${conns.length} connections per config; Istio's fates ${JSON.stringify(fates)}; eBPF documented differences ${JSON.stringify(allowed)}\n${report}${report ? '\n' : ''}${line}`);
    if (process.env.ISTIO_DIFF_SUMMARY) writeFileSync(`${process.env.ISTIO_DIFF_SUMMARY}.fates`, JSON.stringify({ kind: 'fates', seed: SEED, configs: results.length, connections, differ: bad.length, ms, fates, allowed }));
    expect(results.length).toBe(RUNS);
    // the matrix is not vacuous: every fate occurs
    if (RUNS >= 20) for (const f of ['captured-outbound', 'captured-inbound', 'direct', 'refused']) expect(fates[f] ?? 0, `no connection ended ${f}`).toBeGreaterThan(0);
    // every named eBPF difference still occurs (an allowance nothing needs any more is removed, not kept)
    if (RUNS >= 20) {
      for (const a of [...EBPF_CONN_ALLOWANCES.map((x) => x.name), ...DOCUMENTED_REFUSALS.map((d) => `eBPF refuses ${d}`)]) {
        expect(allowed[a] ?? 0, `the eBPF allowance '${a}' was never needed`).toBeGreaterThan(0);
      }
    }
    expect(bad.length, `${bad.length} of ${results.length} configs differ:\n\n${report}`).toBe(0);
  }, scaled(Math.max(600_000, RUNS * 6000))); // a long run on a loaded machine: up to 6 s a config
});
