// deploy/grafana/meshcap-dashboard.json queries only metrics the agent
// exports (the registry createMetrics builds, default process metrics
// included), and meshcap's own metric names follow Prometheus conventions.
// test/privileged/agent/grafana-dashboard.test.ts checks the same against a
// running agent's /metrics.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { createMetrics } from '../../../src/agent/metrics.js';
import { createInstallMetrics } from '../../../src/install-cni/run.js';
import type { StateStore } from '../../../src/agent/state-store.js';
import { families, queriedFamilies } from '../../helpers/prometheus.js';

interface Panel { id: number; title: string; gridPos: unknown; datasource: unknown; targets: { expr: string }[] }
const dashboard = JSON.parse(readFileSync(new URL('../../../deploy/grafana/meshcap-dashboard.json', import.meta.url), 'utf8')) as {
  panels: Panel[]; templating: { list: { name: string; definition?: string }[] };
};

const exprs = [...dashboard.panels.flatMap((p) => p.targets.map((t) => t.expr)), ...dashboard.templating.list.flatMap((v) => (v.definition ? [v.definition] : []))];

describe('the Grafana dashboard', () => {
  it('queries only metrics the agent and install-cni export', async () => {
    const known = families((await createMetrics({ list: () => [] } as unknown as StateStore, () => null, { perPod: true }).registry.metrics()) +
      (await createInstallMetrics(() => true).registry.metrics()));
    const queried = queriedFamilies(exprs, known);
    expect(queried.length).toBeGreaterThanOrEqual(9);
    expect(queried.filter((n) => !known.has(n))).toEqual([]);
  });

  it('covers CNI rate, errors and latency, pods by mode, captured connections, repairs, reloads, chain re-insertions, map fill', () => {
    const all = exprs.join('\n');
    for (const m of ['meshcap_repair_pods_total', 'meshcap_cni_config_reinsertions_total', 'meshcap_bpf_map_entries', 'meshcap_cni_requests_total', 'meshcap_cni_request_duration_seconds_bucket', 'meshcap_pods{', 'meshcap_redirected_connections_total', 'meshcap_pod_redirected_connections_total', 'meshcap_reconcile_pods_total', 'meshcap_datapath_reloads_total', 'meshcap_pods_unrestored']) {
      expect(all, m).toContain(m);
    }
  });

  it('is a well-formed dashboard: unique panel ids, a data source and a position on each, every query filtered by $instance', () => {
    const ids = dashboard.panels.map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    for (const p of dashboard.panels) {
      expect(p.datasource, p.title).toEqual({ type: 'prometheus', uid: '${datasource}' });
      expect(p.gridPos, p.title).toBeDefined();
      for (const t of p.targets) expect(t.expr, p.title).toContain('instance=~"$instance"');
    }
  });

  it('meshcap\'s metric names follow Prometheus conventions', async () => {
    const known = families(await createMetrics({ list: () => [] } as unknown as StateStore, () => null, { perPod: true }).registry.metrics());
    const own = [...known].filter(([n]) => n.startsWith('meshcap_') && !n.startsWith('meshcap_agent_'));
    expect(own.length).toBeGreaterThanOrEqual(7);
    for (const [name, type] of own) {
      expect(name, name).toMatch(/^meshcap_[a-z][a-z0-9_]*[a-z0-9]$/);
      if (type === 'counter') expect(name, `${name}: counters end in _total`).toMatch(/_total$/);
      else expect(name, `${name}: only counters end in _total`).not.toMatch(/_total$/);
      if (/duration|latency|time/.test(name)) expect(name, `${name}: time in seconds`).toMatch(/_seconds(_total)?$/);
    }
  });

  it('per-pod series only with perPod; the node total stays monotonic when a pod goes away or its counters restart', async () => {
    const records = [
      { mode: 'ebpf', netnsCookie: '11', podNamespace: 'a', podName: 'p1' },
      { mode: 'ebpf', netnsCookie: '12', podNamespace: 'a', podName: 'p2' },
    ];
    let stats: Record<string, { outbound: bigint; inbound: bigint; own_pod: bigint; dns: bigint }> = {
      11: { outbound: 5n, inbound: 1n, own_pod: 0n, dns: 0n },
      12: { outbound: 3n, inbound: 0n, own_pod: 0n, dns: 0n },
    };
    const store = { list: () => records } as unknown as StateStore;
    const ebpf = { stats: (c: bigint) => stats[String(c)] ?? null, fill: () => [{ map: 'mc_pods', entries: records.length, maxEntries: 16384 }] } as never;
    const outbound = async (m: ReturnType<typeof createMetrics>) => Number(/meshcap_redirected_connections_total\{direction="outbound"\} (\d+)/.exec(await m.registry.metrics())?.[1]);
    const m = createMetrics(store, () => ebpf);
    expect(await m.registry.metrics()).not.toContain('meshcap_pod_redirected_connections_total');
    expect(await outbound(m)).toBe(8);
    expect(await m.registry.metrics()).toMatch(/meshcap_bpf_map_entries\{map="mc_pods"\} 2\n[^]*meshcap_bpf_map_max_entries\{map="mc_pods"\} 16384/);
    records.pop(); // p2 deleted: its 3 stay counted
    stats = { 11: { outbound: 7n, inbound: 1n, own_pod: 0n, dns: 0n } };
    expect(await outbound(m)).toBe(10);
    stats = { 11: { outbound: 1n, inbound: 1n, own_pod: 0n, dns: 0n } }; // p1 re-registered with fresh stats
    expect(await outbound(m)).toBe(11);
    const perPod = createMetrics(store, () => ebpf, { perPod: true });
    expect(await perPod.registry.metrics()).toContain('meshcap_pod_redirected_connections_total{namespace="a",pod="p1",direction="outbound"} 1');
  });
});
