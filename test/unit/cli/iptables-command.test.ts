import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { registerIptablesCommand } from '../../../src/cli/iptables-command.js';
import { parseRenderArgs, renderForArgs } from '../../../src/fallback-iptables/render-request.js';
import { parseIstioIptablesArgs } from '../../../src/redirect/flags.js';
import { renderIptables } from '../../../src/fallback-iptables/render.js';

async function run(argv: string[]): Promise<{ out: string; err: string; code: number | undefined }> {
  let out = '';
  let err = '';
  const program = new Command('meshcap').exitOverride().configureOutput({ writeErr: (s) => (err += s), writeOut: (s) => (out += s) });
  registerIptablesCommand(program, { write: (s) => (out += s) });
  let code: number | undefined;
  try {
    await program.parseAsync(['node', 'meshcap', ...argv]);
  } catch (e) {
    code = (e as { exitCode?: number }).exitCode;
  }
  return { out, err, code };
}

describe('meshcap iptables render', () => {
  const flags = ['-p', '15001', '-z', '15006', '-u', '1337', '-m', 'REDIRECT', '-i', '*', '-b', '*', '-d', '15020', '-q', '8080'];

  it('parses istio-iptables short flags through commander', async () => {
    const { out, code } = await run(['iptables', 'render', ...flags]);
    expect(code).toBeUndefined();
    const expected = renderIptables(parseIstioIptablesArgs(flags, { env: process.env }).config).v4;
    expect(out).toBe(expected);
    expect(out).toContain('-A ISTIO_OUTPUT -p tcp --dport 8080 -j ISTIO_REDIRECT\n');
  });

  it('--family 6 prints the v6 rules, wherever it appears', async () => {
    const { out } = await run(['iptables', 'render', '-i', '*', '--family', '6', '-u', '1337']);
    expect(out).toContain('-A ISTIO_OUTPUT -o lo -s ::6/128 -j RETURN\n');
    expect(out).not.toContain('127.0.0.1');
  });

  it('--dns-servers-v4 stands in for /etc/resolv.conf', () => {
    const text = renderForArgs(['--redirect-dns', '-u', '1337', '--dns-servers-v4', '10.96.0.10'], {});
    expect(text).toContain('-A ISTIO_OUTPUT_DNS -p udp --dport 53 -d 10.96.0.10/32 -j REDIRECT --to-port 15053\n');
  });

  it('--pod renders a YAML or JSON pod with istio-cni defaults', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'meshcap-cli-'));
    const pod = {
      apiVersion: 'v1', kind: 'Pod',
      metadata: { name: 'p', annotations: { 'traffic.sidecar.istio.io/excludeOutboundPorts': '5555' } },
      spec: { containers: [{ name: 'app' }, { name: 'istio-proxy', securityContext: { runAsUser: 1000 } }] },
    };
    let y, j;
    try {
      writeFileSync(join(dir, 'pod.yaml'), stringify(pod));
      writeFileSync(join(dir, 'pod.json'), JSON.stringify(pod));
      y = await run(['iptables', 'render', '--pod', join(dir, 'pod.yaml')]);
      j = await run(['iptables', 'render', `--pod=${join(dir, 'pod.json')}`]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    expect(y.out).toBe(j.out);
    expect(y.out).toContain('-A ISTIO_OUTPUT -p udp --dport 5555 -j RETURN\n');
    expect(y.out).toContain('--uid-owner 1000 ');
    expect(y.out).toContain('-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN\n');
  });

  it('reports invalid input naming the flag, with exit code 2', async () => {
    const r = await run(['iptables', 'render', '-i', '10.0.0.0/40']);
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/-i, --istio-service-cidr/);
    const m = await run(['iptables', 'render', '--family', '5']);
    expect(m.err).toMatch(/--family must be 4 or 6/);
  });

  it('refuses --pod together with istio-iptables flags', () => {
    expect(() => parseRenderArgs(['--pod', 'x', '-p', '1'])).toThrow(/cannot be combined/);
  });
});
