// The benches' figures are drawn by gnuplot (gnuplot-nox, installed by
// scripts/setup.sh) from their JSON alone: bench:datapath's latency
// distribution and bench:cni's ADD/DEL distribution, as SVG with a line per
// mode. Drawn for real into a temp dir.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { plotCni, type CniBenchData } from '../../../bench/cni/plot.js';
import { plotLatency } from '../../../bench/datapath/plot.js';
import { summarize, type BenchData } from '../../../bench/datapath/report.js';
import type { RoundResult } from '../../../bench/datapath/run.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'meshcap-plots-test-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('bench figures', () => {
  it('bench:datapath draws a latency distribution panel per leg and test, a line per mode', () => {
    const cdf = (us: number): [number, number][] => Array.from({ length: 99 }, (_, i) => [(i + 1) / 100, us + i] as [number, number]);
    const results: RoundResult[] = (['direct', 'ebpf'] as const).map((mode, k) => ({
      round: 0, leg: 'echo', mode, testName: 'rr1', test: 'rr', size: 1, ops: 1, opsPerSec: 1, connects: 1, p50us: 10, p99us: 20, cdf: cdf(10 + k),
    }));
    const data = {
      startedAt: '2026-11-24T21:00:00.000Z', machine: { cpu: 'cpu', cpus: 2, kernel: '6.x' },
      options: { rounds: 1, tests: ['rr1', 'stream'], legs: ['echo'], modes: ['direct', 'ebpf'] },
      summary: summarize(results),
    } as unknown as BenchData;
    const file = path.join(dir, 'dp-latency.svg');
    plotLatency(data, file);
    const svg = readFileSync(file, 'utf8');
    expect(svg).toMatch(/^<\?xml|<svg/);
    expect(svg).toContain('rr 1 B, echo leg');
    expect(svg).not.toContain('stream, echo leg'); // stream has no per-operation latency
    for (const m of ['direct', 'ebpf']) expect(svg).toContain(`>${m}<`);
  });

  it('bench:cni draws its rows from the samples in its JSON and refuses a JSON without them', () => {
    const row = (mode: string, samples: number[]) => ({ mode, pod: 'meshed' as const, concurrency: 1, p50: 1, p99: 2, samples });
    const data: CniBenchData = { pods: 3, concurrency: 16, kernel: '6.x', loadBefore: [1, 2, 3], startedAt: '2026-11-24T21:00:00.000Z', results: [row('ebpf', [1, 2, 3]), row('istio-cni', [50, 60, 70])] };
    const file = path.join(dir, 'cni.svg');
    plotCni(data, file);
    const svg = readFileSync(file, 'utf8');
    expect(svg).toContain('meshed pod (Istio defaults), ADD, one at a time');
    for (const m of ['ebpf', 'istio-cni']) expect(svg).toContain(`>${m}<`);
    expect(() => plotCni({ ...data, results: data.results.map(({ samples: _s, ...r }) => r) }, file)).toThrow(/no samples/);
  });
});
