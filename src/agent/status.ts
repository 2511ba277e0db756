// `meshcap status`: every pod in the datapath, from the agent's state records
// and the live datapath (pinned eBPF maps, iptables counters in the pod netns).
// Needs no running agent.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { pinLayout } from '../loader/manifest.js';
import { MAP, mcStats } from '../maps/layout.js';
import { EbpfBackend } from '../pod-datapath/ebpf.js';
import type { PodDatapath } from '../pod-datapath/pod-datapath.js';
import { netnsState } from '../pod-netns.js';
import { configOf, cookieOf, readRecords, type AttachmentRecord } from './state-store.js';

export interface PodStatus {
  namespace: string | null;
  name: string | null;
  containerId: string | null;
  netns: string | null;
  netnsCookie: string | null;
  mode: 'ebpf' | 'iptables';
  modeReason?: string;
  profile: string | null;
  podIPs: string[];
  capture: {
    outboundPort: string;
    inboundPort: string;
    inboundPorts: string;
    excludeInboundPorts: string;
    outboundPorts: string;
    excludeOutboundPorts: string;
    outboundIPRanges: string;
    excludeOutboundIPRanges: string;
    proxyUID: string;
  } | null;
  /** Connections redirected, from the datapath; null when it cannot tell. */
  connections: { outbound: number; inbound: number; ownPod?: number; dns?: number } | null;
  /**
   * present: the datapath matches the record (CHECK would pass); drift: it
   * differs (see `drift`; the agent's self-check repairs it); missing:
   * recorded but not in the datapath at all; orphan: in the maps without a record.
   */
  state: 'present' | 'drift' | 'missing' | 'netns-gone' | 'orphan' | 'unknown';
  /** What differs between the record and the live datapath (CHECK's findings); empty when it matches. */
  drift: string[];
}

export interface StatusReport {
  stateDir: string;
  pinRoot: string;
  ebpfLoaded: boolean;
  pods: PodStatus[];
  problems: string[];
}

function captureOf(rec: AttachmentRecord): PodStatus['capture'] {
  const s = rec.settings;
  return {
    outboundPort: s.proxyPort,
    inboundPort: s.inboundCapturePort,
    inboundPorts: s.inboundPortsInclude,
    excludeInboundPorts: s.inboundPortsExclude,
    outboundPorts: s.outboundPortsInclude,
    excludeOutboundPorts: s.outboundPortsExclude,
    outboundIPRanges: s.outboundIPRangesInclude,
    excludeOutboundIPRanges: s.outboundIPRangesExclude,
    proxyUID: s.proxyUID.join(','),
  };
}

/**
 * Connections iptables redirected in a pod netns: the nat table sees the first
 * packet of each connection only, so the packet counters of the REDIRECT/TPROXY
 * chains' rules are connection counts.
 */
export async function iptablesConnections(netns: string): Promise<{ outbound: number; inbound: number } | null> {
  try {
    // loaded here: a node of eBPF pods never needs them (status starts faster)
    const [{ execa }, { binaryName, detectVariant }] = await Promise.all([import('execa'), import('../fallback-iptables/apply.js')]);
    const variant = await detectVariant(netns, 4);
    const r = await execa('nsenter', [`--net=${netns}`, binaryName(variant, 4, '-save'), '-c', '-t', 'nat']);
    let outbound = 0;
    let inbound = 0;
    for (const line of r.stdout.split('\n')) {
      const m = /^\[(\d+):\d+\] -A (ISTIO_REDIRECT|ISTIO_IN_REDIRECT) /.exec(line);
      if (!m) continue;
      if (m[2] === 'ISTIO_REDIRECT') outbound += Number(m[1]);
      else inbound += Number(m[1]);
    }
    return { outbound, inbound };
  } catch {
    return null;
  }
}

/** Netns lookups in flight (libuv runs four at a time; the rest wait queued). */
const NETNS_LOOKUPS = 16;

async function mapLimit<T, R>(items: T[], width: number, f: (x: T, i: number) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(width, items.length) }, async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await f(items[i]!, i);
    }
  }));
  return out;
}

export async function collectStatus(opts: { stateDir: string; pinRoot: string }): Promise<StatusReport> {
  const { records, problems } = readRecords(opts.stateDir);
  const ebpfLoaded = existsSync(path.join(pinLayout(opts.pinRoot).maps, MAP.pods));
  let ebpf: EbpfBackend | null = null;
  if (ebpfLoaded) {
    try {
      ebpf = new EbpfBackend(opts.pinRoot);
    } catch (err) {
      problems.push((err as Error).message);
    }
  }
  try {
    // Every pod's entries and counters, each map read whole (a lookup per
    // pod and entry, or a scan per pod, is what made 10,000 pods slow).
    const snap = ebpf?.snapshot();
    const inMaps = new Set(snap?.pods.keys() ?? []);
    const statsOf = (cookie: bigint) => {
      const v = snap?.stats.get(cookie);
      return v ? mcStats.decode(v) : null;
    };
    // iptables pods only (CHECK's rules in their netns); loaded when there is one
    let dp: PodDatapath | undefined;
    const datapath = async () => {
      if (dp) return dp;
      const [{ pino }, { PodDatapath }] = await Promise.all([import('pino'), import('../pod-datapath/pod-datapath.js')]);
      return (dp = new PodDatapath(ebpf, pino({ level: 'silent' })));
    };
    const pods: PodStatus[] = [];
    // A pod's pinned link shows its netns live without a lookup (most eBPF
    // pods): the proofs' syscalls run on a worker thread while this one
    // compares every eBPF pod's map entries with its record (at 10,000 pods
    // ~190 and ~300 ms, one after the other before). The others' lookups are
    // a setns on a helper thread each: many at once.
    const linked = records.filter((rec) => rec.mode === 'ebpf' && rec.netnsCookie !== null);
    const proofs = ebpf ? ebpf.netnsShownLiveManyAsync(linked.map((rec) => ({ netnsPath: rec.netns, netns: cookieOf(rec)! }))) : Promise.resolve([]);
    const mapDrift = new Map<AttachmentRecord, string[]>();
    for (const rec of ebpf ? linked : []) {
      try {
        mapDrift.set(rec, ebpf!.checkMapEntries(cookieOf(rec)!, configOf(rec), rec.podIPs, snap));
      } catch (err) {
        mapDrift.set(rec, [(err as Error).message]);
      }
    }
    const shownList = await proofs;
    const shownSet = new Set(linked.filter((_, i) => shownList[i]));
    for (const rec of shownSet) snap?.inboundSeen.add(cookieOf(rec)!);
    const shown = records.map((rec) => shownSet.has(rec));
    const states = await mapLimit(records, NETNS_LOOKUPS, async (rec, i) => (shown[i] ? 'live' as const : netnsState(rec.netns, cookieOf(rec))));
    for (const [i, rec] of records.entries()) {
      const cookie = cookieOf(rec);
      const row: PodStatus = {
        namespace: rec.podNamespace,
        name: rec.podName,
        containerId: rec.containerId,
        netns: rec.netns,
        netnsCookie: rec.netnsCookie,
        mode: rec.mode,
        ...(rec.modeReason ? { modeReason: rec.modeReason } : {}),
        profile: rec.profile,
        podIPs: rec.podIPs,
        capture: captureOf(rec),
        connections: null,
        state: 'unknown',
        drift: [],
      };
      const netns = states[i]!;
      if (netns !== 'live') {
        row.state = 'netns-gone';
        if (netns === 'replaced') row.drift = [`${rec.netns} is now a different network namespace`];
        if (cookie !== null) inMaps.delete(cookie);
      } else if (rec.mode === 'ebpf') {
        if (!ebpf || cookie === null) {
          row.state = 'missing';
          row.drift = [ebpf ? 'eBPF record without a netns cookie' : `eBPF datapath not loaded (no pins under ${opts.pinRoot})`];
        } else {
          // The netns is live and is the recorded one (above): what CHECK adds is the entries.
          const link = ebpf.checkInboundLink(cookie, configOf(rec), snap);
          row.drift = [...(mapDrift.get(rec) ?? []), ...(link ? [link] : [])];
          row.state = !inMaps.has(cookie) ? 'missing' : row.drift.length > 0 ? 'drift' : 'present';
          inMaps.delete(cookie);
          const s = statsOf(cookie);
          if (s) row.connections = { outbound: Number(s.outbound), inbound: Number(s.inbound), ownPod: Number(s.own_pod), dns: Number(s.dns) };
        }
      } else {
        row.drift = await (await datapath()).check({ mode: rec.mode, netns: rec.netns, config: configOf(rec), podIPs: rec.podIPs }, cookie).catch((err: Error) => [err.message]);
        row.connections = await iptablesConnections(rec.netns);
        row.state = row.drift.length > 0 ? 'drift' : row.connections ? 'present' : 'unknown';
      }
      pods.push(row);
    }
    for (const cookie of inMaps) {
      const s = statsOf(cookie);
      pods.push({
        namespace: null, name: null, containerId: null, netns: null, netnsCookie: cookie.toString(),
        mode: 'ebpf', profile: null, podIPs: [], capture: null,
        connections: s ? { outbound: Number(s.outbound), inbound: Number(s.inbound), ownPod: Number(s.own_pod), dns: Number(s.dns) } : null,
        state: 'orphan',
        drift: [],
      });
    }
    return { stateDir: opts.stateDir, pinRoot: opts.pinRoot, ebpfLoaded, pods, problems };
  } finally {
    ebpf?.close();
  }
}

function ports(include: string, exclude: string): string {
  const inc = include === '*' ? 'all' : include === '' ? 'none' : include;
  return exclude && include === '*' ? `${inc} except ${exclude}` : inc;
}

/** The human table. */
/** `wide` adds the container id and the netns cookie (and keeps every column). */
export function formatStatus(r: StatusReport, opts: { wide?: boolean } = {}): string {
  const wide = opts.wide === true;
  const header = ['POD', 'MODE', 'PROFILE', ...(wide ? ['CONTAINER', 'COOKIE'] : []), 'NETNS', 'IPS', 'INBOUND', 'OUTBOUND', 'CONN OUT', 'CONN IN', 'STATE'];
  const rows = r.pods.map((p) => [
    p.namespace ? `${p.namespace}/${p.name}` : `(no record) cookie ${p.netnsCookie}`,
    p.mode,
    p.profile ?? '-',
    ...(wide ? [p.containerId ? p.containerId.slice(0, 12) : '-', p.netnsCookie ?? '-'] : []),
    p.netns ?? '-',
    p.podIPs.join(',') || '-',
    p.capture ? `${ports(p.capture.inboundPorts, p.capture.excludeInboundPorts)} -> ${p.capture.inboundPort}` : '-',
    p.capture
      ? `ports ${p.capture.outboundPorts ? p.capture.outboundPorts : 'all'}${p.capture.excludeOutboundPorts ? ` except ${p.capture.excludeOutboundPorts}` : ''}; ` +
        `ips ${p.capture.outboundIPRanges === '*' ? 'all' : p.capture.outboundIPRanges || 'none'}${p.capture.excludeOutboundIPRanges ? ` except ${p.capture.excludeOutboundIPRanges}` : ''} -> ${p.capture.outboundPort}`
      : '-',
    p.connections ? String(p.connections.outbound) : '-',
    p.connections ? String(p.connections.inbound) : '-',
    p.state,
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i]!.length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]!))).join('  ');
  const out = [
    `state ${r.stateDir}; eBPF datapath ${r.ebpfLoaded ? `loaded at ${r.pinRoot}` : `not loaded (no pins under ${r.pinRoot})`}`,
    '',
  ];
  if (rows.length === 0) out.push('no pods in the datapath');
  else out.push(line(header), ...rows.map(line));
  for (const p of r.pods) if (p.modeReason) out.push(`note: ${p.namespace}/${p.name} uses iptables mode: ${p.modeReason}`);
  for (const p of r.pods) {
    if (p.drift.length > 0) out.push(`differs from its record: ${p.namespace}/${p.name}: ${p.drift.join('; ')} (the agent's self-check restores it)`);
  }
  for (const p of r.problems) out.push(`problem: ${p}`);
  return out.join('\n');
}
