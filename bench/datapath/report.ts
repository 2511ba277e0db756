// What a run reports: medians per (leg, test, mode), per-round paired
// ratios to direct, iptables and noproxy, the time per operation above
// direct, the latency distribution; the table on stdout; the machine and
// what else ran on it, for the JSON.
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import { LEGS, TESTS, type Leg, type Mode, type TestName } from './matrix.js';
import type { RoundResult } from './run.js';

export interface Ratio {
  median: number;
  min: number;
  max: number;
  /** 95% interval of the median (medianInterval); on per-round ratios only */
  ci95?: [number, number];
}

export interface Summary {
  leg: Leg;
  testName: TestName;
  mode: Mode;
  test: string;
  size: number;
  rounds: number;
  unit: 'Gbit/s' | 'ops/s';
  rate: number;
  rateMin: number;
  rateMax: number;
  p50us: number;
  p99us: number;
  vsDirect: Ratio | null;
  vsIptables: Ratio | null;
  vsNoproxy: Ratio | null;
  /** to podsrc, the floor of a redirect that keeps the pod's address (matrix.ts) */
  vsPodsrc?: Ratio | null;
  /**
   * µs per operation above direct: per round 1e6/rate − 1e6/rate(direct),
   * paired; mc-bench-load is one thread doing one operation at a time, so
   * 1/rate is the mean time of one operation (stream: of one 64 KiB echoed).
   */
  overDirectUs: Ratio | null;
  /** p50 latency above direct's, µs, paired per round (steadier than the mean on a busy machine; null for stream) */
  overDirectP50Us: Ratio | null;
  /** [quantile, µs]: per quantile the median over the rounds (empty for stream). */
  cdfUs: [number, number][];
}

/** The bench's JSON (docs/data/bench-datapath*.json). */
export interface BenchData {
  startedAt: string;
  finishedAt: string;
  durationS: number;
  machine: Machine;
  options: {
    rounds: number; seconds: number; warmup: number; tests: TestName[]; legs: Leg[]; modes: Mode[]; cpus: { app: string; proxy: string; server: string };
    /** the whole path's HAProxy in the mesh modes: SO_ORIGINAL_DST (server 0.0.0.0:0) or the service's fixed address; absent before 2026-11-29 (origdst) */
    proxyTarget?: 'origdst' | 'fixed';
  };
  otherTests: { atStart: number; atEnd: number };
  foreignCgroupPrograms: number | null;
  paths: { leg: Leg; mode: Mode; target: string; tcpSegsPerExchange: number | undefined }[];
  summary: Summary[];
  results: RoundResult[];
  profile: unknown[] | null;
  /** --bpf-stats: the programs' own CPU per operation (bpfstats.ts) */
  bpfStats?: unknown[] | null;
  /** os.loadavg() (1, 5, 15 min) at the start and the end of the run */
  loadAvg?: { atStart: number[]; atEnd: number[] };
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

/**
 * A distribution-free 95% confidence interval of the median: the order
 * statistics at ranks n/2 ∓ 1.96·√n/2 (the binomial's normal approximation),
 * so no assumption about how a noisy host spreads the rounds. With few
 * rounds it widens to [min, max]: 5 rounds cannot tell 2% on this host,
 * 120 can (docs/bench-datapath.md).
 */
export function medianInterval(xs: number[]): [number, number] {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  const h = (1.96 * Math.sqrt(n)) / 2;
  const lo = Math.max(1, Math.floor(n / 2 - h));
  const hi = Math.min(n, Math.ceil(n / 2 + h + 1));
  return [s[lo - 1]!, s[hi - 1]!];
}

const rate = (r: RoundResult): number => (r.test === 'stream' ? r.gbitPerSec ?? 0 : r.opsPerSec);

export function summarize(results: RoundResult[]): Summary[] {
  const key = (r: { leg: string; testName: string; mode: string }) => `${r.leg}/${r.testName}/${r.mode}`;
  const byKey = new Map<string, RoundResult[]>();
  for (const r of results) {
    const l = byKey.get(key(r)) ?? [];
    l.push(r);
    byKey.set(key(r), l);
  }
  const out: Summary[] = [];
  for (const rs of byKey.values()) {
    const first = rs[0]!;
    const rates = rs.map(rate);
    const ratio = (ref: Mode): Ratio | null => {
      const refs = byKey.get(key({ ...first, mode: ref }));
      if (!refs) return null;
      const paired = rs.flatMap((r) => {
        const o = refs.find((x) => x.round === r.round);
        return o ? [rate(r) / rate(o)] : [];
      });
      return paired.length ? { median: median(paired), min: Math.min(...paired), max: Math.max(...paired), ci95: medianInterval(paired) } : null;
    };
    const directs = byKey.get(key({ ...first, mode: 'direct' }));
    const over = rs.flatMap((r) => {
      const o = directs?.find((x) => x.round === r.round);
      return o && r.opsPerSec > 0 && o.opsPerSec > 0 ? [1e6 / r.opsPerSec - 1e6 / o.opsPerSec] : [];
    });
    const overP50 = first.test === 'stream' ? [] : rs.flatMap((r) => {
      const o = directs?.find((x) => x.round === r.round);
      return o ? [r.p50us - o.p50us] : [];
    });
    const cdfs = rs.map((r) => r.cdf ?? []).filter((c) => c.length);
    const cdfUs = (cdfs[0] ?? []).map(([q], i): [number, number] => [q, median(cdfs.map((c) => c[i]?.[1] ?? NaN))]);
    out.push({
      leg: first.leg, testName: first.testName, mode: first.mode, test: first.test, size: first.size, rounds: rs.length,
      unit: first.test === 'stream' ? 'Gbit/s' : 'ops/s',
      rate: median(rates), rateMin: Math.min(...rates), rateMax: Math.max(...rates),
      p50us: median(rs.map((r) => r.p50us)), p99us: median(rs.map((r) => r.p99us)),
      vsDirect: ratio('direct'), vsIptables: ratio('iptables'), vsNoproxy: ratio('noproxy'), vsPodsrc: ratio('podsrc'),
      overDirectUs: over.length ? { median: median(over), min: Math.min(...over), max: Math.max(...over) } : null,
      overDirectP50Us: overP50.length ? { median: median(overP50), min: Math.min(...overP50), max: Math.max(...overP50) } : null,
      cdfUs,
    });
  }
  return out;
}

export function table(summary: Summary[], legs: Leg[], tests: TestName[], modes: Mode[]): string {
  const lines: string[] = [];
  const f = (x: number | null | undefined, d = 0) => (x === null || x === undefined ? '-' : x.toLocaleString('en-US', { minimumFractionDigits: d, maximumFractionDigits: d }));
  const r = (x: Ratio | null) => (x ? `${x.median.toFixed(2)}×` : '-');
  const plus = (x: Ratio | null) => (x ? `${x.median >= 0 ? '+' : ''}${x.median.toFixed(2)}` : '-');
  for (const leg of legs) {
    lines.push('', `== ${LEGS[leg]}`);
    for (const t of tests) {
      const rows = modes.flatMap((m) => summary.filter((s) => s.leg === leg && s.testName === t && s.mode === m));
      if (!rows.length) continue;
      const stream = rows[0]!.test === 'stream';
      const podsrc = rows.some((s) => s.mode === 'podsrc');
      lines.push(`-- ${TESTS[t].label}`);
      lines.push(`${'mode'.padEnd(12)} ${(stream ? 'Gbit/s' : 'ops/s').padStart(9)} ${'spread'.padStart(7)} ${'p50 µs'.padStart(8)} ${'p99 µs'.padStart(8)} ${'×direct'.padStart(8)}${podsrc ? ` ${'×podsrc'.padStart(8)}` : ''} ${'×iptables'.padStart(9)} ${'µs/op>direct'.padStart(12)} ${'p50>direct'.padStart(10)}`);
      for (const s of rows) {
        const spread = s.rate ? `±${(((s.rateMax - s.rateMin) / 2 / s.rate) * 100).toFixed(1)}%` : '-';
        lines.push([
          s.mode.padEnd(12),
          (stream ? f(s.rate, 2) : f(s.rate)).padStart(9),
          spread.padStart(7),
          (stream ? '-' : f(s.p50us, 1)).padStart(8),
          (stream ? '-' : f(s.p99us, 1)).padStart(8),
          r(s.vsDirect).padStart(8),
          ...(podsrc ? [r(s.vsPodsrc ?? null).padStart(8)] : []),
          r(s.vsIptables).padStart(9),
          plus(s.mode === 'direct' ? null : s.overDirectUs).padStart(12),
          plus(s.mode === 'direct' ? null : s.overDirectP50Us).padStart(10),
        ].join(' '));
      }
      // Whether a ratio is resolved: its median's interval, once there are rounds enough to narrow it.
      for (const [col, ref, pick] of [['×direct', 'direct', (x: Summary) => x.vsDirect], ['×podsrc', 'podsrc', (x: Summary) => x.vsPodsrc ?? null]] as const) {
        const parts = rows.filter((x) => x.mode !== ref && x.mode !== 'direct' && x.rounds >= 10 && pick(x)?.ci95).map((x) => `${x.mode} ${pick(x)!.ci95![0].toFixed(3)}–${pick(x)!.ci95![1].toFixed(3)}`);
        if (parts.length) lines.push(`   ${col}, 95% interval of the median (${rows[0]!.rounds} paired rounds): ${parts.join(' · ')}`);
      }
    }
  }
  return lines.join('\n');
}

/** The JSON as stored: indented, with each latency distribution on one line. */
export function toJson(data: BenchData): string {
  return JSON.stringify(data, (k, v: unknown) => (k === 'cdfUs' ? JSON.stringify(v) : v), 1).replace(/"cdfUs": "(\[[^"]*\])"/g, '"cdfUs": $1') + '\n';
}

export interface Machine {
  cpu: string;
  cpus: number;
  kernel: string;
  node: string;
  haproxy: string;
  iptables: string;
  virtualization: string;
  memGiB: number;
}

export function machine(): Machine {
  const sh = (c: string, a: string[]) => {
    try {
      return execFileSync(c, a, { encoding: 'utf8' }).trim();
    } catch {
      return '?';
    }
  };
  return {
    cpu: os.cpus()[0]?.model.trim() ?? '?', cpus: os.cpus().length, kernel: os.release(), node: process.version,
    haproxy: (sh('haproxy', ['-v']).split('\n')[0] ?? '?').replace(/ - https?:.*$/, ''),
    iptables: sh('iptables', ['--version']),
    virtualization: sh('systemd-detect-virt', []),
    memGiB: Math.round(os.totalmem() / 2 ** 30),
  };
}

/** BPF programs attached at the cgroup v2 root right now (ours are not loaded yet when this is asked). */
export function cgroupRootPrograms(): number | null {
  try {
    const cg = execFileSync('findmnt', ['-n', '-t', 'cgroup2', '-o', 'TARGET'], { encoding: 'utf8' }).trim().split('\n')[0] ?? '';
    const out = execFileSync('bpftool', ['-j', 'cgroup', 'show', cg], { encoding: 'utf8' });
    return (JSON.parse(out || '[]') as unknown[]).length;
  } catch {
    return null;
  }
}

/** vitest processes on the machine: numbers taken next to them are disturbed. */
export function otherTests(): number {
  try {
    return execFileSync('pgrep', ['-f', 'vitest'], { encoding: 'utf8' }).trim().split('\n').filter(Boolean).length;
  } catch {
    return 0;
  }
}
