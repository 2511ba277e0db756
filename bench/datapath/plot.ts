// The bench's figure: two panels (legs), bars per test and mode, the median
// rate relative to iptables mode, whiskers min..max of the paired ratios
// (gnuplot, from the JSON alone, so --plot-only can redraw a stored run).
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { LEGS, TESTS } from './matrix.js';
import type { BenchData } from './report.js';

export function plot(data: BenchData, file: string): void {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'meshcap-plot-'));
  try {
    const { modes, legs, tests } = data.options;
    const panels: string[] = [];
    for (const leg of legs) {
      const dat = path.join(dir, `${leg}.dat`);
      const rows = tests.map((t) => {
        const cells = modes.map((m) => {
          const v = data.summary.find((x) => x.leg === leg && x.testName === t && x.mode === m)?.vsIptables;
          return v ? `${v.median} ${v.min} ${v.max}` : 'NaN NaN NaN';
        });
        return `"${TESTS[t].label}" ${cells.join(' ')}`;
      });
      writeFileSync(dat, rows.join('\n') + '\n');
      const cols = modes.flatMap((m, i) => (data.summary.some((x) => x.leg === leg && x.mode === m) ? [`'${dat}' using ${2 + i * 3}:${3 + i * 3}:${4 + i * 3}:xtic(1) title '${m}' lc ${i + 1}`] : []));
      panels.push(`set title "${LEGS[leg]}"\nplot ${cols.join(', \\\n  ')}, 1 notitle dt 2 lc 'black'`);
    }
    const m = data.machine;
    const gp = [
      `set terminal pngcairo noenhanced size ${560 * legs.length},560 font 'sans,10'`,
      `set output '${path.resolve(file)}'`,
      `set multiplot layout 1,${legs.length} title "meshcap datapath: rate relative to iptables mode (median of ${data.options.rounds} interleaved rounds, whiskers min..max)\\n${m.cpu} ×${m.cpus}, Linux ${m.kernel}, ${m.haproxy}"`,
      'set style data histogram',
      'set style histogram errorbars gap 1 lw 1',
      'set style fill solid 0.8 border -1',
      'set yrange [0:*]',
      'set ylabel "× iptables"',
      'set grid ytics',
      'set key below horizontal',
      ...panels,
      'unset multiplot',
    ].join('\n');
    const script = path.join(dir, 'plot.gp');
    writeFileSync(script, gp + '\n');
    execFileSync('gnuplot', [script], { stdio: ['ignore', 'ignore', 'pipe'] });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
