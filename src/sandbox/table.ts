// The live table: pods, mode, connections, what the datapath and the
// sidecars saw, latency. Pure (views in, text out); the caller redraws it in
// place on a terminal and prints it once per mode otherwise.
import { ISTIO_PROXY_CONTAINER } from '../mesh/vocabulary.js';
import { percentile, type Check, type PodView } from './traffic.js';

const ms = (x: number | null) => (x === null ? '-' : x >= 100 ? `${x.toFixed(0)}ms` : x >= 10 ? `${x.toFixed(1)}ms` : `${x.toFixed(2)}ms`);

function saw(v: PodView): string {
  if (v.role === 'server') {
    const total = [...v.served.values()].reduce((a, b) => a + b, 0);
    return `served ${total}` + (v.served.size ? ` (${[...v.served].sort((a, b) => a[0] - b[0]).map(([p, n]) => `:${p} ×${n}`).join(', ')})` : '');
  }
  if (v.sidecar === 'none') return '-';
  const entries = [...v.proxySaw].sort();
  if (entries.length === 0) return v.sidecar === 'trap' ? 'nothing (as it should)' : 'nothing yet';
  return entries.map(([k, n]) => `${k} ×${n}`).join(', ');
}

export function renderTable(views: PodView[]): string {
  const header = ['POD', 'IP', 'SIDECAR', 'MODE', 'CONNS OK', 'CAPTURED', 'SIDECAR SAW (original destination × conns)', 'P50', 'P99', 'CNI'];
  const rows = views.map((v) => [
    v.name,
    v.ip || '-',
    v.sidecar === 'proxy' ? ISTIO_PROXY_CONTAINER : v.sidecar === 'trap' ? 'none*' : 'none',
    v.mode ?? (v.cniAdd === 'ok' ? 'not meshed' : '-'),
    v.role === 'server' ? '-' : `${v.ok}/${v.planned}${v.failed ? ` (${v.failed} failed)` : ''}`,
    v.captured === null ? '-' : String(v.captured),
    saw(v),
    ms(percentile(v.latencies, 50)),
    ms(percentile(v.latencies, 99)),
    `${v.cniAdd === 'ok' ? 'ADD' : v.cniAdd === 'error' ? 'ADD✗' : ''}${v.cniDel === 'ok' ? ' DEL' : v.cniDel === 'error' ? ' DEL✗' : ''}`.trim() || '-',
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]!))).join('  ').trimEnd();
  return [line(header), ...rows.map(line)].join('\n');
}

export const TABLE_LEGEND =
  'CAPTURED: connections the datapath redirected (eBPF counter / iptables REDIRECT counter); ' +
  'none*: an unmeshed pod with a listener on 15001 as uid 1337 that must see nothing.';

export function renderChecks(checks: Check[], verbose: boolean): string {
  const bad = checks.filter((c) => !c.ok);
  const shown = verbose ? checks : bad;
  return shown.map((c) => `  ${c.ok ? 'ok  ' : 'FAIL'} ${c.text}`).join('\n');
}

/** Cursor up n lines and clear to the end: redraw a block in place on a terminal. */
export const redrawPrefix = (previousLines: number) => (previousLines > 0 ? `\x1b[${previousLines}F\x1b[J` : '');
