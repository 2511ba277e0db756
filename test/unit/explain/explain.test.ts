// meshcap explain: the verdict for one connection, walked through the rules
// the iptables fallback renders (byte-identical to istio-iptables).
import { Command } from 'commander';
import { describe, expect, it, vi } from 'vitest';
import { stringify } from 'yaml';
import type { V1Pod } from '@kubernetes/client-node';
import { configureExits, runCli } from '../../../src/cli/exit.js';
import { registerExplainCommand } from '../../../src/cli/explain-command.js';
import { explainFlow, type Flow } from '../../../src/explain/explain.js';
import { podToCaptureConfig } from '../../../src/redirect/pod.js';
import { parseIstioIptablesArgs } from '../../../src/redirect/flags.js';

const pod = (annotations: Record<string, string> = {}, env: { name: string; value: string }[] = []): V1Pod => ({
  kind: 'Pod',
  metadata: { name: 'web', annotations: { 'sidecar.istio.io/status': '{}', ...annotations } },
  spec: { containers: [{ name: 'app' }, { name: 'istio-proxy', env }] },
  status: { podIPs: [{ ip: '10.1.0.5' }] },
});
const out = (peer: string, port: number, over: Partial<Flow> = {}): Flow => ({ direction: 'outbound', peer, port, protocol: 'tcp', uid: 1000, gid: 1000, podIPs: ['10.1.0.5'], ...over });
const inb = (port: number, over: Partial<Flow> = {}): Flow => ({ direction: 'inbound', peer: '10.9.9.9', port, protocol: 'tcp', uid: 0, gid: 0, podIPs: ['10.1.0.5'], ...over });

describe('explainFlow', () => {
  const config = podToCaptureConfig(pod({
    'traffic.sidecar.istio.io/excludeOutboundIPRanges': '10.200.0.0/16',
    'traffic.sidecar.istio.io/excludeOutboundPorts': '5432',
    'traffic.sidecar.istio.io/excludeInboundPorts': '9000',
  }), 'istio');

  it('outbound: captured to 15001 by default, naming the jumps and the REDIRECT', () => {
    const r = explainFlow(config, out('10.96.0.10', 443));
    expect(r).toMatchObject({ verdict: 'captured', toPort: 15001 });
    expect(r.trail).toEqual(['-A OUTPUT -j ISTIO_OUTPUT', '-A ISTIO_OUTPUT -j ISTIO_REDIRECT', '-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001']);
  });

  it('outbound: an excluded CIDR, an excluded port, the proxy\'s uid, loopback and the pod\'s own address go directly, each by its rule', () => {
    expect(explainFlow(config, out('10.200.1.1', 443)).rule).toBe('-A ISTIO_OUTPUT -d 10.200.0.0/16 -j RETURN');
    expect(explainFlow(config, out('10.96.0.10', 5432)).rule).toBe('-A ISTIO_OUTPUT -p tcp --dport 5432 -j RETURN');
    expect(explainFlow(config, out('10.96.0.10', 443, { uid: 1337, gid: 1337 })).rule).toBe('-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN');
    expect(explainFlow(config, out('127.0.0.1', 8080)).rule).toBe('-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN');
    expect(explainFlow(config, out('10.1.0.5', 8080)).verdict).toBe('not captured');
  });

  it('the sidecar connecting to its own pod address is sent to the inbound port (15006)', () => {
    const r = explainFlow(config, out('10.1.0.5', 8080, { uid: 1337, gid: 1337 }));
    expect(r).toMatchObject({ verdict: 'captured', toPort: 15006 });
    expect(r.trail[1]).toBe('-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT');
  });

  it('inbound: captured to 15006; excluded ports, 15020/15021/15090 and the tunnel port 15008 pass', () => {
    expect(explainFlow(config, inb(8080))).toMatchObject({ verdict: 'captured', toPort: 15006 });
    expect(explainFlow(config, inb(9000)).rule).toBe('-A ISTIO_INBOUND -p tcp --dport 9000 -j RETURN');
    for (const p of [15008, 15020, 15021, 15090]) expect(explainFlow(config, inb(p)).verdict, String(p)).toBe('not captured');
  });

  it('TPROXY inbound is walked through mangle and captured to 15006', () => {
    const tproxy = podToCaptureConfig(pod({ 'sidecar.istio.io/interceptionMode': 'TPROXY' }), 'istio');
    const r = explainFlow(tproxy, inb(8080));
    expect(r).toMatchObject({ verdict: 'captured', toPort: 15006 });
    expect(r.path[0]).toBe('mangle PREROUTING');
  });

  it('only listed CIDRs (-i) are captured; DNS to 15053 only with DNS capture', () => {
    const { config: only } = parseIstioIptablesArgs(['-u', '1337', '-i', '10.96.0.0/12'], { env: {} });
    expect(explainFlow(only, out('10.96.0.10', 443)).verdict).toBe('captured');
    expect(explainFlow(only, out('8.8.8.8', 443)).verdict).toBe('not captured');
    expect(explainFlow(config, out('10.96.0.10', 53, { protocol: 'udp' })).verdict).toBe('not captured');
    const dns = podToCaptureConfig(pod({}, [{ name: 'ISTIO_META_DNS_CAPTURE', value: 'true' }]), 'istio');
    expect(explainFlow(dns, out('10.96.0.10', 53, { protocol: 'udp' }))).toMatchObject({ verdict: 'captured', toPort: 15053 });
  });
});

describe('meshcap explain', () => {
  async function run(argv: string[], stdin?: string) {
    let text = '';
    let err = '';
    const log = vi.spyOn(console, 'log').mockImplementation((s: string) => { text += `${s}\n`; });
    const fs = await import('node:fs');
    const read = stdin === undefined ? undefined : vi.spyOn(fs, 'readFileSync');
    try {
      const program = configureExits(new Command('meshcap')).configureOutput({ writeErr: (s) => (err += s) });
      registerExplainCommand(program);
      const code = await runCli(program, ['node', 'meshcap', ...argv], { err: (s) => (err += s) });
      return { text, err, code };
    } finally {
      log.mockRestore();
      read?.mockRestore();
    }
  }

  it('usage errors: neither or both of --to/--from, --from without --port (exit 2)', async () => {
    expect((await run(['explain', '--pod', 'x.yaml'])).code).toBe(2);
    expect((await run(['explain', '--pod', 'x.yaml', '--to', '1.2.3.4:80', '--from', '1.2.3.4'])).code).toBe(2);
    expect((await run(['explain', '--pod', 'x.yaml', '--from', '1.2.3.4'])).err).toMatch(/--from needs --port/);
    expect((await run(['explain', '--pod', 'x.yaml', '--to', 'nope'])).code).toBe(2);
  });

  it('a missing manifest is a failure (exit 1) naming it', async () => {
    const r = await run(['explain', '--pod', '/nonexistent/web.yaml', '--to', '10.96.0.10:443']);
    expect(r.code).toBe(1);
    expect(r.err).toMatch(/cannot read pod manifest \/nonexistent\/web.yaml/);
  });

  it('says that a pod istio-cni skips is not captured at all, and why', async () => {
    const { mkdtempSync, writeFileSync, rmSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const dir = mkdtempSync(`${tmpdir()}/meshcap-explain-`);
    try {
      writeFileSync(`${dir}/p.yaml`, stringify({ kind: 'Pod', metadata: { name: 'p' }, spec: { containers: [{ name: 'app' }] } }));
      const r = await run(['explain', '--pod', `${dir}/p.yaml`, '--to', '10.96.0.10:443']);
      expect(r.code).toBe(0);
      expect(r.text).toMatch(/^NOT captured: the pod is not redirected at all: no istio-proxy or linkerd-proxy container/);
      writeFileSync(`${dir}/w.yaml`, stringify(pod()));
      const w = await run(['explain', '--pod', `${dir}/w.yaml`, '--to', '10.96.0.10:443', '--json']);
      expect(JSON.parse(w.text)).toMatchObject({ verdict: 'captured', toPort: 15001, profile: 'istio' });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
