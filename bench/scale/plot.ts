// bench:scale's figure: how the node's cost moves as it fills up, drawn by
// gnuplot from the JSON alone. Four panels against the pods registered (log
// axis): ADD latency (exec to exit p50/p99, the agent's own p50), the
// agent's memory (after the sample, at rest, its lifetime peak) beside the
// 100 MB goal, the cold start and `meshcap status` beside their goals, and
// the ADD latency distribution at each size (where the JSON has samples).
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { gnuplot, PERCENTILE_AXIS, terminal } from '../datapath/plot.js';

interface Summary { p50: number; p90?: number; p99: number }

export interface ScaleRow {
  pods: number;
  addExecToExit: Summary;
  addAgent: Summary;
  /** every ADD's exec-to-exit time, ms (runs before 2026-11-25 afternoon kept none) */
  addSamplesMs?: number[];
  agentMem: { rss: number; peak: number };
  status: { ms: number };
  selfCheckWatch?: { restMiB: number; peakMiB: number };
  coldStart?: { wallMs: number };
}

export interface ScaleBenchData {
  when: string;
  kernel: string;
  cpus: number;
  sample: number;
  results: ScaleRow[];
  /** the first size again, after DELs back down from the last (runs before 2026-11-25 evening have none) */
  drained?: ScaleRow;
}

/** MiB (what /proc shows) in MB (what the goal says). */
const MB = 1.048576;
/** Issue 19 item 5's goals. */
const RSS_GOAL_MB = 100;
const STATUS_GOAL_MS = 1000;
const COLD_GOALS: [number, number][] = [[1000, 1000], [10000, 5000]];

export function plotScale(data: ScaleBenchData, file: string): void {
  const rows = [...data.results].sort((a, b) => a.pods - b.pods);
  if (rows.length === 0) throw new Error('this bench:scale JSON has no results: nothing to plot');
  const xmax = rows.at(-1)!.pods * 2;
  const xmin = Math.max(1, rows[0]!.pods / 2);
  const podsAxis = [
    'set logscale x',
    `set xrange [${xmin}:${xmax}]`,
    'set xlabel "pods registered on the node"',
    'set grid xtics ytics',
    'set key below',
    // room above the highest point (a goal sits on the top edge otherwise)
    'set offsets 0, 0, graph 0.1, 0',
    'unset logscale y',
  ].join('\n');
  gnuplot((dir) => {
    const dat = (name: string, lines: string[]) => {
      const f = path.join(dir, `${name}.dat`);
      writeFileSync(f, lines.join('\n') + '\n');
      return `'${f}'`;
    };
    const col = (pick: (r: ScaleRow) => number | undefined) => rows.filter((r) => pick(r) !== undefined).map((r) => `${r.pods} ${pick(r)!}`);
    const panels: string[] = [];

    const add50 = dat('add50', col((r) => r.addExecToExit.p50));
    const add99 = dat('add99', col((r) => r.addExecToExit.p99));
    const agent50 = dat('agent50', col((r) => r.addAgent.p50));
    const d = data.drained;
    panels.push([
      podsAxis,
      'set title "meshed eBPF ADD"',
      'set ylabel "ms"',
      'set yrange [0:*]',
      `plot ${add50} using 1:2 with linespoints lw 2 pt 7 lc 4 title 'exec to exit, p50', \\`,
      `  ${add99} using 1:2 with linespoints lw 1 pt 6 lc 4 dt 2 title 'exec to exit, p99', \\`,
      `  ${agent50} using 1:2 with linespoints lw 2 pt 5 lc 2 title "the agent's own, p50"${d ? ', \\' : ''}`,
      ...(d ? [`  ${dat('drained', [`${d.pods} ${d.addExecToExit.p50} ${d.addAgent.p50}`])} using 1:2 with points pt 9 ps 1.8 lc 4 title 'p50 again, drained back to ${d.pods} at the end', \\`,
        `  '' using 1:3 with points pt 9 ps 1.8 lc 2 notitle`] : []),
    ].join('\n'));

    const after = dat('rss', col((r) => r.agentMem.rss * MB));
    const peak = dat('peak', col((r) => r.agentMem.peak * MB));
    const rest = col((r) => (r.selfCheckWatch ? r.selfCheckWatch.restMiB * MB : undefined));
    const checkPeak = col((r) => (r.selfCheckWatch ? r.selfCheckWatch.peakMiB * MB : undefined));
    panels.push([
      podsAxis,
      'set title "agent memory (RSS)"',
      'set ylabel "MB"',
      'set yrange [0:*]',
      `plot ${after} using 1:2 with linespoints lw 2 pt 7 lc 4 title 'after the ADD sample', \\`,
      ...(rest.length ? [`  ${dat('rest', rest)} using 1:2 with points pt 5 ps 1.5 lc 2 title 'at rest (self-check watched)', \\`] : []),
      ...(checkPeak.length ? [`  ${dat('checkpeak', checkPeak)} using 1:2 with points pt 9 ps 1.5 lc 3 title 'peak through a self-check', \\`] : []),
      `  ${peak} using 1:2 with linespoints lw 1 pt 6 lc 7 title 'lifetime peak (VmHWM)', \\`,
      `  ${RSS_GOAL_MB} with lines lw 1 dt 3 lc 8 title 'goal: ${RSS_GOAL_MB} MB'`,
    ].join('\n'));

    const cold = col((r) => r.coldStart?.wallMs);
    const status = dat('status', col((r) => r.status.ms));
    panels.push([
      podsAxis,
      'set title "cold start (spawn to ready) and meshcap status"',
      'set ylabel "ms"',
      'set yrange [0:*]',
      `plot ${status} using 1:2 with linespoints lw 2 pt 7 lc 4 title 'meshcap status over every pod', \\`,
      ...(cold.length ? [`  ${dat('cold', cold)} using 1:2 with linespoints lw 2 pt 5 lc 2 title 'agent cold start adopting them', \\`] : []),
      `  ${dat('coldgoal', COLD_GOALS.map(([p, ms]) => `${p} ${ms}`))} using 1:2 with points pt 3 ps 2 lc 2 title 'cold start goals', \\`,
      `  ${STATUS_GOAL_MS} with lines lw 1 dt 3 lc 4 title 'status goal'`,
    ].join('\n'));

    const dists = rows.filter((r) => r.addSamplesMs?.length).map((r, i) => {
      const s = [...r.addSamplesMs!].sort((a, b) => a - b);
      // the i-th smallest of n is the (i/n)-quantile
      const f = dat(`dist${i}`, s.map((ms, k) => `${1 / (1 - k / s.length)} ${ms}`));
      return `${f} using 1:2 with lines lw 2 lc ${[2, 4, 7, 3, 6][i % 5]} title '${r.pods} pods'`;
    });
    panels.push(dists.length
      ? [PERCENTILE_AXIS, 'set key below', 'set offsets 0, 0, 0, 0', `set xrange [1:${Math.max(2, data.sample)}]`, 'set logscale y', 'set yrange [*:*]', 'set title "ADD exec to exit, distribution per size"', 'set ylabel "ms"', `plot ${dists.join(', \\\n  ')}`].join('\n')
      : 'set multiplot next');

    return [
      terminal(file, 1200, 940),
      `set output '${path.resolve(file)}'`,
      `set multiplot layout 2,2 title "bench:scale, ${data.when.slice(0, 16).replace('T', ' ')} UTC, Linux ${data.kernel}, ${data.cpus} CPUs, ${data.sample} ADDs per size"`,
      ...panels,
      'unset multiplot',
    ].join('\n');
  });
}
