// Running the bench: the C tools (compiled here when missing or older than
// their source: bench tools, not shipped), one mc-bench-load run inside a pod
// netns on the app CPU, and the interleaved rounds over all cells.
import path from 'node:path';
import { execa } from 'execa';
import type { Logger } from 'pino';
import type { Lab } from '../../src/lab/index.js';
import type { StepProgress } from '../../scripts/lib/progress.mjs';
import type { Cell } from './cells.js';
import { TESTS, type Leg, type Mode, type TestName } from './matrix.js';
import { compileIfStale } from '../lib/cc.js';

export interface Cpus {
  app: string;
  proxy: string;
  server: string;
}

/** What mc-bench-load prints (one JSON object). */
export interface LoadResult {
  ops: number;
  opsPerSec: number;
  connects: number;
  gbitPerSec?: number;
  p50us: number;
  p99us: number;
  /** [quantile, µs] at 1%..99%, 99.5%, 99.9% (empty for stream); summarized, then left out of the stored results */
  cdf?: [number, number][];
}

export interface RoundResult extends LoadResult {
  round: number;
  leg: Leg;
  mode: Mode;
  testName: TestName;
  test: string;
  size: number;
}

export function buildTools(src: string, bin: string, log: Logger): void {
  for (const t of ['mc-bench-echo', 'mc-bench-load']) {
    const out = path.join(bin, t);
    if (compileIfStale(path.join(src, `${t}.c`), out, ['-O2', '-Wall', '-Wextra'])) log.info({ event: 'compiled', tool: out });
  }
}

/** One mc-bench-load run inside the pod netns, on the app CPU. */
export async function load(lab: Lab, bin: string, cpus: Cpus, ns: string, target: { host: string; port: number }, testName: TestName, seconds: number, warmup: number): Promise<LoadResult & { test: string; size: number }> {
  const t = TESTS[testName];
  const cmd = [path.join(bin, 'mc-bench-load'), '--test', t.test, '--size', String(t.size), '--host', target.host, '--port', String(target.port), '--seconds', String(seconds), '--warmup', String(warmup)];
  try {
    const { stdout } = await execa('ip', lab.argv(ns, cmd, { cpu: cpus.app }), { timeout: (seconds + warmup) * 1000 + 15000 });
    return JSON.parse(stdout) as LoadResult & { test: string; size: number };
  } catch (e) {
    const err = e as { stderr?: string; message: string };
    throw new Error(`mc-bench-load ${testName} in ${ns} against ${target.host}:${target.port} failed: ${(err.stderr || err.message).trim()}`);
  }
}

/** Tcp OutSegs of a netns (/proc/net/snmp is per netns). */
export async function tcpOutSegs(lab: Lab, ns: string): Promise<number> {
  const { stdout } = await execa('ip', lab.argv(ns, ['cat', '/proc/net/snmp']));
  const [names = [], values = []] = stdout.split('\n').filter((l) => l.startsWith('Tcp:')).map((l) => l.split(/\s+/));
  return Number(values[names.indexOf('OutSegs')]);
}

/**
 * Every test for every cell, `rounds` times. Modes are interleaved (the
 * order rotated every round) so drift hits all of them alike, and no mode is
 * always first after a test switch.
 */
export async function runRounds(o: { lab: Lab; bin: string; cpus: Cpus; cells: Cell[]; legs: Leg[]; tests: TestName[]; rounds: number; seconds: number; warmup: number; progress: StepProgress; log: Logger }): Promise<RoundResult[]> {
  const results: RoundResult[] = [];
  const t0 = Date.now();
  for (let round = 0; round < o.rounds; round++) {
    for (const testName of o.tests) {
      for (const leg of o.legs) {
        const legCells = o.cells.filter((c) => c.leg === leg);
        const order = legCells.map((_, i) => legCells[(i + round) % legCells.length]!);
        for (const cell of order) {
          o.progress.step(`round ${round + 1}/${o.rounds} ${testName} ${leg} leg, ${cell.mode}`);
          const r = await load(o.lab, o.bin, o.cpus, cell.pod.ns, cell.target, testName, o.seconds, o.warmup);
          results.push({ ...r, round, leg, mode: cell.mode, testName });
        }
      }
    }
    o.log.info({ event: 'round', round: round + 1, of: o.rounds, elapsedS: Math.round((Date.now() - t0) / 1000) });
  }
  return results;
}
