import { describe, expect, it } from 'vitest';
import { renderTable } from '../../../src/sandbox/table.js';
import { checkPhase, newView, onProxyLine, onWorkloadLine, percentile, type PodView } from '../../../src/sandbox/traffic.js';

const conn = (target: string, ok = true, ms = 1) => JSON.stringify({ event: 'conn', target, ok, ms, ...(ok ? { reply: 'x' } : { error: 'ECONNREFUSED' }) });
const accept = (orig: string) => JSON.stringify({ event: 'accept', listener: 'outbound', orig, local: '127.0.0.1:15001', peer: '127.0.0.1:4000' });

/** A phase where everything went right: 2 connections per client pod. */
function goodPhase(mode: string): PodView[] {
  const server = newView('server', 'server', '198.19.1.2', 2);
  const meshed = newView('meshed-1', 'meshed', '198.19.1.3', 2);
  const unmeshed = newView('unmeshed', 'unmeshed', '198.19.1.4', 2);
  for (const v of [meshed, unmeshed]) {
    onWorkloadLine(v, conn('198.19.1.2:8080'));
    onWorkloadLine(v, conn('198.19.1.2:9090'));
  }
  onProxyLine(meshed, accept('198.19.1.2:8080'));
  onProxyLine(meshed, accept('198.19.1.2:9090'));
  for (let i = 0; i < 4; i++) onWorkloadLine(server, JSON.stringify({ event: 'served', port: 8080, peer: 'p' }));
  meshed.mode = mode;
  meshed.captured = 2;
  for (const v of [server, meshed, unmeshed]) {
    v.cniAdd = 'ok';
    v.cniDel = 'ok';
  }
  return [server, meshed, unmeshed];
}

describe('sandbox traffic accounting', () => {
  it('counts connections, latencies and what the proxy saw; ignores non-JSON lines', () => {
    const v = newView('meshed-1', 'meshed', '198.19.1.3', 3);
    onWorkloadLine(v, conn('198.19.1.2:8080', true, 2.5));
    onWorkloadLine(v, conn('198.19.1.2:9090', false));
    onWorkloadLine(v, 'Error: something on stdout');
    onProxyLine(v, accept('198.19.1.2:8080'));
    onProxyLine(v, JSON.stringify({ event: 'accept', listener: 'inbound', orig: '198.19.1.3:80' }));
    onProxyLine(v, JSON.stringify({ event: 'upstream-error', error: 'ECONNRESET' }));
    expect(v).toMatchObject({ done: 2, ok: 1, failed: 1, latencies: [2.5], proxyErrors: 1 });
    expect([...v.dialed]).toEqual([['198.19.1.2:8080', 1]]);
    expect([...v.proxySaw]).toEqual([['198.19.1.2:8080', 1]]);
    expect(v.lastError).toBe('proxy: ECONNRESET');
  });

  it('percentiles by nearest rank', () => {
    expect(percentile([], 50)).toBeNull();
    expect(percentile([5, 1, 3], 50)).toBe(3);
    expect(percentile(Array.from({ length: 100 }, (_, i) => i + 1), 99)).toBe(99);
    expect(percentile([1, 2], 100)).toBe(2);
  });

  it('passes a phase where everything went right', () => {
    expect(checkPhase(goodPhase('ebpf'), 'ebpf').filter((c) => !c.ok)).toEqual([]);
  });

  it.each([
    ['the proxy saw another destination', (v: PodView[]) => { v[1]!.proxySaw = new Map([['198.19.1.2:8080', 2]]); }, /meshed-1: its sidecar saw/],
    ['the proxy saw nothing', (v: PodView[]) => { v[1]!.proxySaw = new Map(); }, /meshed-1: its sidecar saw/],
    ['the meshed pod is in the other mode', (v: PodView[]) => { v[1]!.mode = 'iptables'; }, /set up by the agent in iptables mode/],
    ['the datapath counted fewer', (v: PodView[]) => { v[1]!.captured = 1; }, /counted 1 redirected/],
    ['the unmeshed pod was captured', (v: PodView[]) => { onProxyLine(v[2]!, accept('198.19.1.2:8080')); }, /unmeshed: none of its connections was captured \(listener on 15001 saw 1\)/],
    ['the unmeshed pod got datapath state', (v: PodView[]) => { v[2]!.mode = 'ebpf'; }, /unmeshed: not meshed/],
    ['a connection failed', (v: PodView[]) => { onWorkloadLine(v[1]!, conn('198.19.1.2:8080', false)); }, /meshed-1: 2\/2 connections answered.*ECONNREFUSED/],
    ['a DEL never reached the agent', (v: PodView[]) => { v[0]!.cniDel = '-'; }, /server: CNI DEL reached meshcap \(never seen\)/],
    ['an ADD failed', (v: PodView[]) => { v[2]!.cniAdd = 'error'; }, /unmeshed: CNI ADD reached meshcap \(error\)/],
  ])('fails when %s', (_what, spoil, re) => {
    const views = goodPhase('ebpf');
    spoil(views);
    const bad = checkPhase(views, 'ebpf').filter((c) => !c.ok);
    expect(bad.length).toBeGreaterThan(0);
    expect(bad.map((c) => c.text).join('\n')).toMatch(re);
  });

  it('renders one aligned row per pod', () => {
    const t = renderTable(goodPhase('iptables')).split('\n');
    expect(t).toHaveLength(4);
    const col = t[0]!.indexOf('CAPTURED');
    expect(t[2]!.slice(col).startsWith('2 ')).toBe(true);
    expect(t[1]).toMatch(/^server +198\.19\.1\.2 +none +not meshed +- +- +served 4 \(:8080 ×4\)/);
    expect(t[2]).toMatch(/^meshed-1 +198\.19\.1\.3 +istio-proxy +iptables +2\/2 +2 +198\.19\.1\.2:8080 ×1, 198\.19\.1\.2:9090 ×1 +1\.00ms +1\.00ms +ADD DEL$/);
    expect(t[3]).toMatch(/^unmeshed +198\.19\.1\.4 +none\* +not meshed +2\/2 +- +nothing \(as it should\)/);
  });
});
