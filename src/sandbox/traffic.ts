// What each pod did and what the datapath and proxies saw, built from the
// JSON lines of the workload, the proxies and the agent; and the checks that
// decide the verdict. Pure: fed lines, asked for numbers.
import type { PodRole } from './plan.js';

export interface PodView {
  name: string;
  role: PodRole;
  ip: string;
  /** proxy: the pod's sidecar; trap: a listener on 15001 in an unmeshed pod that must see nothing */
  sidecar: 'proxy' | 'trap' | 'none';
  /** the datapath's mode for this pod (from the agent's records), null when the agent set nothing up */
  mode: string | null;
  planned: number;
  done: number;
  ok: number;
  failed: number;
  latencies: number[];
  /** original destination -> connections, as the proxy read them with SO_ORIGINAL_DST */
  proxySaw: Map<string, number>;
  proxyErrors: number;
  /** target -> connections the app made that the server answered */
  dialed: Map<string, number>;
  /** connections the datapath counted as redirected (eBPF map counter / iptables REDIRECT packet counter) */
  captured: number | null;
  /** server only: port -> connections served */
  served: Map<number, number>;
  cniAdd: 'ok' | 'error' | '-';
  cniDel: 'ok' | 'error' | '-';
  lastError?: string;
}

export function newView(name: string, role: PodRole, ip: string, planned: number): PodView {
  return {
    name, role, ip,
    sidecar: role === 'meshed' ? 'proxy' : role === 'unmeshed' ? 'trap' : 'none',
    mode: null, planned: role === 'server' ? 0 : planned, done: 0, ok: 0, failed: 0, latencies: [],
    proxySaw: new Map(), proxyErrors: 0, dialed: new Map(), captured: null, served: new Map(),
    cniAdd: '-', cniDel: '-',
  };
}

function json(line: string): Record<string, unknown> | undefined {
  if (!line.startsWith('{')) return undefined;
  try {
    return JSON.parse(line) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

const bump = <K>(m: Map<K, number>, k: K) => m.set(k, (m.get(k) ?? 0) + 1);

/** A line of workload.js (client or server). */
export function onWorkloadLine(v: PodView, line: string): void {
  const j = json(line);
  if (!j) return;
  if (j.event === 'conn') {
    v.done++;
    if (j.ok) {
      v.ok++;
      v.latencies.push(Number(j.ms));
      bump(v.dialed, String(j.target));
    } else {
      v.failed++;
      v.lastError = `${String(j.target)}: ${String(j.error)}`;
    }
  } else if (j.event === 'served') {
    bump(v.served, Number(j.port));
  }
}

/** A line of the reference proxy (`meshcap proxy`): one "accept" per connection it got. */
export function onProxyLine(v: PodView, line: string): void {
  const j = json(line);
  if (!j) return;
  if (j.event === 'accept' && j.listener === 'outbound') bump(v.proxySaw, String(j.orig));
  else if (j.event === 'error' || j.event === 'upstream-error') {
    v.proxyErrors++;
    v.lastError = `proxy: ${String(j.error)}`;
  }
}

export function percentile(xs: number[], p: number): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

export interface Check {
  ok: boolean;
  text: string;
}

const fmtMap = (m: Map<string, number>) => [...m].sort().map(([k, n]) => `${k} ×${n}`).join(', ') || 'nothing';
const same = (a: Map<string, number>, b: Map<string, number>) => a.size === b.size && [...a].every(([k, n]) => b.get(k) === n);

/**
 * The verdict for one mode, after the clients finished and before the pods
 * were deleted (the counters), plus the CNI requests the agent logged.
 */
export function checkPhase(views: PodView[], mode: string): Check[] {
  const out: Check[] = [];
  for (const v of views) {
    out.push({ ok: v.cniAdd === 'ok', text: `${v.name}: CNI ADD reached meshcap (${v.cniAdd === '-' ? 'never seen' : v.cniAdd})` });
    out.push({ ok: v.cniDel === 'ok', text: `${v.name}: CNI DEL reached meshcap (${v.cniDel === '-' ? 'never seen' : v.cniDel})` });
    if (v.role === 'server') continue;
    out.push({ ok: v.done === v.planned && v.failed === 0, text: `${v.name}: ${v.ok}/${v.planned} connections answered by the server${v.lastError ? ` (last error: ${v.lastError})` : ''}` });
    if (v.role === 'meshed') {
      out.push({ ok: v.mode === mode, text: `${v.name}: set up by the agent in ${v.mode ?? 'no'} mode` });
      out.push({
        ok: v.ok > 0 && same(v.proxySaw, v.dialed) && v.proxyErrors === 0,
        text: `${v.name}: its sidecar saw every connection with its original destination (dialed ${fmtMap(v.dialed)}; proxy saw ${fmtMap(v.proxySaw)})`,
      });
      out.push({ ok: v.captured !== null && v.captured >= v.ok, text: `${v.name}: the datapath counted ${v.captured ?? 'no'} redirected connections (≥ ${v.ok})` });
    } else {
      out.push({ ok: v.mode === null, text: `${v.name}: not meshed, the agent set up nothing (${v.mode ?? 'none'})` });
      const trapped = [...v.proxySaw.values()].reduce((a, b) => a + b, 0);
      out.push({ ok: trapped === 0 && v.ok > 0, text: `${v.name}: none of its connections was captured (listener on 15001 saw ${trapped})` });
    }
  }
  return out;
}
