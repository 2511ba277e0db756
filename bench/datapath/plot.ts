// The bench's figures (gnuplot, from the JSON alone, so --plot-only can
// redraw a stored run): plot() two panels (legs), bars per test and mode,
// the median rate relative to iptables mode, whiskers min..max of the paired
// ratios; plotLatency() the latency distribution per leg and test, one line
// per mode. gnuplot() and PERCENTILE_AXIS are shared with bench/cni/plot.ts.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { LEGS, TESTS } from './matrix.js';
import type { BenchData } from './report.js';

/** gnuplot's terminal for a file: SVG for .svg, else PNG (cairo). */
export function terminal(file: string, width: number, height: number): string {
  return file.endsWith('.svg')
    ? `set terminal svg noenhanced size ${width},${height} font 'sans,11' background rgb 'white'`
    : `set terminal pngcairo noenhanced size ${width},${height} font 'sans,10'`;
}

/**
 * Percentile on x as HdrHistogram draws it: x = 1/(1-q) on a log axis, so
 * 50%, 90%, 99%, 99.9% are evenly spaced and the tail is not squeezed into
 * the last pixel. Data columns are `1/(1-q) value`.
 */
export const PERCENTILE_AXIS = [
  'set logscale x',
  "set xtics ('0%%' 1, '50%%' 2, '90%%' 10, '99%%' 100, '99.9%%' 1000)",
  'set xrange [1:1000]',
  'set xlabel "percentile"',
  'set grid xtics ytics',
  'set key top left',
].join('\n');

/** Runs a gnuplot script whose data files are written into dir by write(dir). */
export function gnuplot(write: (dir: string) => string): void {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'meshcap-plot-'));
  try {
    const script = path.join(dir, 'plot.gp');
    writeFileSync(script, write(dir) + '\n');
    try {
      execFileSync('gnuplot', [script], { stdio: ['ignore', 'ignore', 'pipe'] });
    } catch (e) {
      const stderr = String((e as { stderr?: Buffer }).stderr ?? '').trim();
      throw new Error(`gnuplot failed: ${stderr || (e as Error).message}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Latency distribution: a panel per leg (rows) and per-operation test (columns), a line per mode. */
export function plotLatency(data: BenchData, file: string): void {
  const { modes, legs } = data.options;
  const tests = data.options.tests.filter((t) => data.summary.some((x) => x.testName === t && x.cdfUs?.length));
  if (!tests.length) throw new Error('no latency distribution in this run (runs before the cdf field, or stream only): nothing to plot');
  gnuplot((dir) => {
    const panels: string[] = [];
    for (const leg of legs) {
      for (const t of tests) {
        const lines = modes.flatMap((m, i) => {
          const cdf = data.summary.find((x) => x.leg === leg && x.testName === t && x.mode === m)?.cdfUs ?? [];
          if (!cdf.length) return [];
          const dat = path.join(dir, `${leg}-${t}-${m}.dat`);
          writeFileSync(dat, cdf.map(([q, us]) => `${1 / (1 - q)} ${us}`).join('\n') + '\n');
          return [`'${dat}' using 1:2 with lines lw 2 lc ${i + 1} title '${m}'`];
        });
        panels.push(lines.length ? `set title "${TESTS[t].label}, ${leg} leg"\nplot ${lines.join(', \\\n  ')}` : 'set multiplot next');
      }
    }
    const m = data.machine;
    return [
      terminal(file, 420 * tests.length, 360 * legs.length),
      `set output '${path.resolve(file)}'`,
      `set multiplot layout ${legs.length},${tests.length} title "meshcap datapath: latency per operation (per percentile the median of ${data.options.rounds} round(s))\\n${m.cpu} ×${m.cpus}, Linux ${m.kernel}, ${data.startedAt.slice(0, 16).replace('T', ' ')} UTC"`,
      PERCENTILE_AXIS,
      'set logscale y',
      'set ylabel "µs"',
      ...panels,
      'unset multiplot',
    ].join('\n');
  });
}

export function plot(data: BenchData, file: string): void {
  const { modes, legs, tests } = data.options;
  // Relative to iptables mode when it ran, else to direct (a run of direct, podsrc and ebpf only).
  const ref = modes.includes('iptables') ? 'iptables' : modes.includes('direct') ? 'direct' : null;
  if (!ref) throw new Error('--plot draws rates relative to iptables or direct mode: include one of them in --modes');
  gnuplot((dir) => {
    const panels: string[] = [];
    for (const leg of legs) {
      const dat = path.join(dir, `${leg}.dat`);
      const rows = tests.map((t) => {
        const cells = modes.map((m) => {
          const x = data.summary.find((y) => y.leg === leg && y.testName === t && y.mode === m);
          const v = ref === 'iptables' ? x?.vsIptables : x?.vsDirect;
          return v ? `${v.median} ${v.min} ${v.max}` : 'NaN NaN NaN';
        });
        return `"${TESTS[t].label}" ${cells.join(' ')}`;
      });
      writeFileSync(dat, rows.join('\n') + '\n');
      const cols = modes.flatMap((m, i) => (data.summary.some((x) => x.leg === leg && x.mode === m) ? [`'${dat}' using ${2 + i * 3}:${3 + i * 3}:${4 + i * 3}:xtic(1) title '${m}' lc ${i + 1}`] : []));
      panels.push(`set title "${LEGS[leg]}"\nplot ${cols.join(', \\\n  ')}, 1 notitle dt 2 lc 'black'`);
    }
    const m = data.machine;
    return [
      `set terminal pngcairo noenhanced size ${560 * legs.length},560 font 'sans,10'`,
      `set output '${path.resolve(file)}'`,
      `set multiplot layout 1,${legs.length} title "meshcap datapath: rate relative to ${ref} mode (median of ${data.options.rounds} interleaved rounds, whiskers min..max)\\n${m.cpu} ×${m.cpus}, Linux ${m.kernel}, ${m.haproxy}"`,
      'set style data histogram',
      'set style histogram errorbars gap 1 lw 1',
      'set style fill solid 0.8 border -1',
      'set yrange [0:*]',
      `set ylabel "× ${ref}"`,
      'set grid ytics',
      'set key below horizontal',
      ...panels,
      'unset multiplot',
    ].join('\n');
  });
}
