// bench:cni's figure: the ADD (and DEL) latency distribution, a panel per
// row kind (meshed sequential, meshed N at once, meshed outbound-only,
// unmeshed, DEL) and a line per mode, drawn by gnuplot from the JSON alone
// (the samples of each row), on the percentile axis bench:datapath uses.
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { gnuplot, PERCENTILE_AXIS, terminal } from '../datapath/plot.js';

export interface CniRow {
  mode: string;
  op?: 'DEL' | 'VERSION';
  pod: 'unmeshed' | 'meshed-out' | 'meshed' | 'none';
  /** 'node': exec'd by the bench's Node process (a comparison row, not drawn) */
  parent?: 'node';
  concurrency: number;
  p50: number;
  p99: number;
  /** every exec-to-exit time of the row, ms */
  samples?: number[];
}

export interface CniBenchData {
  pods: number;
  concurrency: number;
  kernel: string;
  loadBefore: number[];
  startedAt?: string;
  results: CniRow[];
}

const MODE_ORDER = ['ebpf', 'iptables', 'istio-cni'];
// the same colour per mode as bench:datapath's figures (iptables 3, ebpf 4; istio-cni red)
const COLOUR: Record<string, number> = { iptables: 3, ebpf: 4, 'istio-cni': 7 };

export function plotCni(data: CniBenchData, file: string): void {
  if (!data.results.some((r) => r.samples?.length)) throw new Error('this bench:cni JSON has no samples (written before they were kept): nothing to plot');
  const panels: { title: string; match: (r: CniRow) => boolean }[] = [
    { title: 'meshed pod (Istio defaults), ADD, one at a time', match: (r) => !r.op && r.pod === 'meshed' && r.concurrency === 1 },
    { title: `meshed pod, ADD, ${data.concurrency} at once`, match: (r) => !r.op && r.pod === 'meshed' && r.concurrency > 1 },
    { title: 'meshed, no inbound capture, ADD', match: (r) => !r.op && r.pod === 'meshed-out' },
    { title: 'unmeshed pod, ADD (the floor)', match: (r) => !r.op && r.pod === 'unmeshed' },
    { title: 'meshed pod, DEL, one at a time', match: (r) => r.op === 'DEL' },
  ];
  const modes = [...new Set(data.results.map((r) => r.mode))].sort((a, b) => MODE_ORDER.indexOf(a) - MODE_ORDER.indexOf(b));
  gnuplot((dir) => {
    const out: string[] = [];
    panels.forEach((p, pi) => {
      const lines = modes.flatMap((m) => {
        const row = data.results.find((r) => r.mode === m && r.parent !== 'node' && p.match(r));
        const s = [...(row?.samples ?? [])].sort((a, b) => a - b);
        if (!s.length) return [];
        // the i-th smallest of n is the (i/n)-quantile
        const dat = path.join(dir, `${pi}-${m}.dat`);
        writeFileSync(dat, s.map((ms, i) => `${1 / (1 - i / s.length)} ${ms}`).join('\n') + '\n');
        return [`'${dat}' using 1:2 with lines lw 2 lc ${COLOUR[m] ?? 6} title '${m}'`];
      });
      out.push(lines.length ? `set title "${p.title}"\nplot ${lines.join(', \\\n  ')}` : 'set multiplot next');
    });
    const when = data.startedAt ? `, ${data.startedAt.slice(0, 16).replace('T', ' ')} UTC` : '';
    return [
      terminal(file, 1260, 720),
      `set output '${path.resolve(file)}'`,
      `set multiplot layout 2,3 title "CNI ADD/DEL, exec of the plugin to its exit, ${data.pods} pods per line${when}\\nLinux ${data.kernel}, load average ${data.loadBefore.map((x) => x.toFixed(1)).join(' ')} at the start"`,
      PERCENTILE_AXIS,
      `set xrange [1:${Math.max(2, data.pods)}]`,
      'set logscale y',
      'set ylabel "ms"',
      ...out,
      'unset multiplot',
    ].join('\n');
  });
}
