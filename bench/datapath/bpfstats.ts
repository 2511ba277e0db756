// --bpf-stats TEST: the BPF programs' own CPU time per operation, from the
// kernel's per-program counters (kernel.bpf_stats_enabled: run_cnt and
// run_time_ns of each program, helpers and map operations included). Unlike
// the perf profile this counts nothing but the programs, whatever else the
// machine runs, so it is the figure for issue 19's "BPF CPU per redirected
// connection". The sysctl is switched on for the measurement only and put
// back as it was. Programs at the cgroup root also run for other processes'
// sockets on the machine: run_cnt per operation shows whether that happened
// (connect4: 1 per crr operation when nothing else connects).
import { readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import type { Lab } from '../../src/lab/index.js';
import type { Cell } from './cells.js';
import type { TestName } from './matrix.js';
import { load, type Cpus } from './run.js';

const SYSCTL = '/proc/sys/kernel/bpf_stats_enabled';

export interface ProgStat {
  name: string;
  id: number;
  /** runs per operation */
  runsPerOp: number;
  /** ns of the program's own CPU per operation */
  nsPerOp: number;
}

export interface CellBpfStats {
  leg: string;
  mode: string;
  test: TestName;
  ops: number;
  opsPerSec: number;
  totalNsPerOp: number;
  progs: ProgStat[];
}

/** Every link pinned under the pin root (cgroup links and the pods' sk_lookup links). */
function pinnedLinks(root: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const e of readdirSync(d)) {
      const p = path.join(d, e);
      if (statSync(p).isDirectory()) walk(p);
      else if (d.includes(`${path.sep}links`) || e === 'inbound') out.push(p);
    }
  };
  walk(root);
  return out;
}

async function progIds(pinRoot: string): Promise<number[]> {
  const ids = new Set<number>();
  for (const pin of pinnedLinks(pinRoot)) {
    const { stdout } = await execa('bpftool', ['-j', 'link', 'show', 'pinned', pin]);
    const l = JSON.parse(stdout) as { prog_id?: number };
    if (l.prog_id) ids.add(l.prog_id);
  }
  return [...ids];
}

async function snapshot(ids: number[]): Promise<Map<number, { name: string; cnt: number; ns: number }>> {
  const m = new Map<number, { name: string; cnt: number; ns: number }>();
  for (const id of ids) {
    const { stdout } = await execa('bpftool', ['-j', 'prog', 'show', 'id', String(id)]);
    const p = JSON.parse(stdout) as { name: string; run_cnt?: number; run_time_ns?: number };
    m.set(id, { name: p.name, cnt: p.run_cnt ?? 0, ns: p.run_time_ns ?? 0 });
  }
  return m;
}

/** Switch the per-program counters on until the lab closes, restoring the previous value. */
export function enableBpfStats(lab: Lab): void {
  const before = readFileSync(SYSCTL, 'utf8').trim();
  writeFileSync(SYSCTL, '1');
  lab.add(`kernel.bpf_stats_enabled=${before}`, () => writeFileSync(SYSCTL, before));
}

export async function bpfStatsCell(o: { lab: Lab; bin: string; cpus: Cpus; seconds: number; pinRoot: string }, cell: Cell, testName: TestName): Promise<CellBpfStats> {
  const ids = await progIds(o.pinRoot);
  const a = await snapshot(ids);
  const r = await load(o.lab, o.bin, o.cpus, cell.pod.ns, cell.target, testName, Math.max(o.seconds, 1), 0);
  const b = await snapshot(ids);
  const progs: ProgStat[] = [];
  for (const [id, after] of b) {
    const was = a.get(id);
    if (!was) continue;
    const cnt = after.cnt - was.cnt;
    if (cnt === 0) continue;
    progs.push({ name: after.name, id, runsPerOp: Number((cnt / r.ops).toFixed(2)), nsPerOp: Math.round((after.ns - was.ns) / r.ops) });
  }
  progs.sort((x, y) => y.nsPerOp - x.nsPerOp);
  return { leg: cell.leg, mode: cell.mode, test: testName, ops: r.ops, opsPerSec: r.opsPerSec, totalNsPerOp: progs.reduce((s, p) => s + p.nsPerOp, 0), progs };
}

export function bpfStatsTable(rows: CellBpfStats[]): string {
  const lines = ['', 'BPF programs\' own CPU per operation (kernel.bpf_stats_enabled; ns, runs per op in brackets):', ''];
  for (const r of rows) {
    lines.push(`${r.leg.padEnd(5)} ${r.mode.padEnd(9)} ${r.test.padEnd(6)} total ${String(r.totalNsPerOp).padStart(5)} ns/op  ${r.progs.map((p) => `${p.name} ${p.nsPerOp} (${p.runsPerOp})`).join(', ')}`);
  }
  // Each run's reading holds one sched_clock() read of the stopwatch besides the program (about 30 ns on this KVM guest).
  lines.push('', 'Each run\'s reading includes the stopwatch itself (one sched_clock() read): bench/datapath/stats-floor.sh measures it, docs/bench-datapath.md "The stopwatch\'s share".');
  return lines.join('\n');
}
