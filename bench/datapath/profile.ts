// --profile TEST: where the CPU time goes. One run of TEST per cell with perf
// sampling the CPU the app runs on (cpu-clock, so it works in a VM without
// PMU access). With the default placement (app, proxy, server on one CPU)
// every cycle of the path lands in the profile, softirqs included, so
// samples per operation are CPU time per operation, split by process and
// kernel subsystem.
import path from 'node:path';
import { execa } from 'execa';
import type { Lab } from '../../src/lab/index.js';
import type { Cell } from './cells.js';
import { TESTS, type Leg, type Mode, type TestName } from './matrix.js';
import { load, type Cpus } from './run.js';

// Kernel symbols by subsystem. conntrack/NAT/nftables is what iptables mode adds per packet; the
// BPF programs and the maps they use are what eBPF mode adds.
// (Not ct_*: that prefix is the kernel's context tracking, not conntrack.)
const NETFILTER = /^(nf_|nft_|__nf|__nft|ipv4_conntrack|ipv4_confirm|iptable_|ipt_|xt_|hash_conntrack|resolve_normal_ct|init_conntrack|tcp_in_window|get_l4proto)|conntrack|_nat_/;
const BPF = /^(bpf_|__bpf|__cgroup_bpf|cgroup_bpf|sk_psock|sk_msg|__sk_msg|sock_map|sock_hash|tcp_bpf|htab_|__htab|pcpu_freelist|trie_|sk_storage|array_map)|bpf_prog|sockmap|_bpf_|bpf_lru|local_storage/;

export interface CellProfile {
  leg: Leg;
  mode: Mode;
  test: TestName;
  ops: number;
  opsPerSec: number;
  samples: number;
  otherProcessSamples: number;
  cpuUsPerOp: number;
  userUsPerOp: { app: number; proxy: number; server: number };
  kernelUsPerOp: { netfilter: number; bpf: number; rest: number };
  topKernel: { sym: string; usPerOp: number }[];
  topNetfilter: { sym: string; usPerOp: number }[];
  topBpf: { sym: string; usPerOp: number }[];
}

export async function profileCell(o: { lab: Lab; bin: string; cpus: Cpus; tmp: string; seconds: number }, cell: Cell, testName: TestName): Promise<CellProfile> {
  const HZ = 4999;
  const secs = Math.max(o.seconds, 1);
  const out = path.join(o.tmp, `perf-${cell.leg}-${cell.mode}.data`);
  const rec = execa('perf', ['record', '-q', '-e', 'cpu-clock', '-F', String(HZ), '-C', o.cpus.app, '-o', out, '--', 'sleep', String(secs + 0.3)], { stdin: 'ignore', stdout: 'ignore', reject: false });
  o.lab.add('perf record', () => rec.kill('SIGKILL'));
  await new Promise((res) => setTimeout(res, 150));
  const r = await load(o.lab, o.bin, o.cpus, cell.pod.ns, cell.target, testName, secs, 0);
  const done = await rec;
  if (done.exitCode !== 0) throw new Error(`perf record failed (${done.exitCode ?? done.signal}): ${String(done.stderr).trim()}`);
  const { stdout } = await execa('perf', ['script', '-i', out, '-F', 'comm,ip,sym,dso'], { maxBuffer: 256 * 2 ** 20 });
  const role = (comm: string) => (comm === 'mc-bench-load' ? 'app' : comm === 'haproxy' ? 'proxy' : comm === 'mc-bench-echo' ? (cell.leg === 'echo' ? 'proxy' : 'server') : null);
  const agg = { samples: 0, idle: 0, other: 0, user: { app: 0, proxy: 0, server: 0 }, kernel: { netfilter: 0, bpf: 0, rest: 0 } };
  const syms = new Map<string, number>();
  for (const line of stdout.split('\n')) {
    const m = /^\s*(.+?)\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$/.exec(line);
    if (!m) continue;
    const [, comm = '', , sym = '', dso = ''] = m;
    agg.samples++;
    if (comm === 'swapper' || comm.startsWith('swapper/')) {
      agg.idle++;
      continue;
    }
    const who = role(comm);
    if (!who) {
      agg.other++;
      continue;
    }
    const kernel = dso.includes('kernel.kallsyms') || dso.includes('bpf') || sym.startsWith('bpf_prog_');
    if (!kernel) {
      agg.user[who]++;
      continue;
    }
    agg.kernel[NETFILTER.test(sym) ? 'netfilter' : BPF.test(sym) ? 'bpf' : 'rest']++;
    syms.set(sym, (syms.get(sym) ?? 0) + 1);
  }
  // µs of CPU per operation (stream: per 64 KiB echoed)
  const us = (n: number) => Number(((n / HZ / r.ops) * 1e6).toFixed(2));
  const top = (filter: (sym: string) => boolean, n: number) => [...syms].filter(([s]) => filter(s)).sort((a, b) => b[1] - a[1]).slice(0, n).map(([sym, c]) => ({ sym, usPerOp: us(c) }));
  return {
    leg: cell.leg, mode: cell.mode, test: testName, ops: r.ops, opsPerSec: r.opsPerSec, samples: agg.samples, otherProcessSamples: agg.other,
    cpuUsPerOp: us(agg.samples - agg.idle - agg.other),
    userUsPerOp: { app: us(agg.user.app), proxy: us(agg.user.proxy), server: us(agg.user.server) },
    kernelUsPerOp: { netfilter: us(agg.kernel.netfilter), bpf: us(agg.kernel.bpf), rest: us(agg.kernel.rest) },
    topKernel: top(() => true, 12),
    topNetfilter: top((s) => NETFILTER.test(s), 6),
    topBpf: top((s) => !NETFILTER.test(s) && BPF.test(s), 6),
  };
}

export function profileTable(profile: CellProfile[], testName: TestName): string {
  const lines = ['', `== where the CPU time goes: ${TESTS[testName].label}, µs of CPU per operation (perf cpu-clock samples on the app CPU)`];
  lines.push(`${'leg/mode'.padEnd(18)} ${'ops/s'.padStart(8)} ${'total'.padStart(7)} ${'app'.padStart(6)} ${'proxy'.padStart(6)} ${'server'.padStart(6)} ${'netfilt'.padStart(7)} ${'bpf'.padStart(6)} ${'kernel'.padStart(7)}  (user: app/proxy/server; kernel: netfilter/bpf/rest)`);
  for (const p of profile) {
    lines.push([
      `${p.leg}/${p.mode}`.padEnd(18), Math.round(p.opsPerSec).toLocaleString('en-US').padStart(8), p.cpuUsPerOp.toFixed(2).padStart(7),
      p.userUsPerOp.app.toFixed(2).padStart(6), p.userUsPerOp.proxy.toFixed(2).padStart(6), p.userUsPerOp.server.toFixed(2).padStart(6),
      p.kernelUsPerOp.netfilter.toFixed(2).padStart(7), p.kernelUsPerOp.bpf.toFixed(2).padStart(6), p.kernelUsPerOp.rest.toFixed(2).padStart(7),
    ].join(' ') + (p.otherProcessSamples > p.samples * 0.05 ? `  (${Math.round((p.otherProcessSamples / p.samples) * 100)}% of samples from other processes)` : ''));
  }
  return lines.join('\n');
}
