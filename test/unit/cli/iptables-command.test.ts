import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { registerIptablesCommand } from '../../../src/cli/iptables-command.js';
import { configureExits, runCli } from '../../../src/cli/exit.js';
import { parseRenderArgs, renderForArgs } from '../../../src/fallback-iptables/render-request.js';
import { parseIstioIptablesArgs } from '../../../src/redirect/flags.js';
import { renderIptables } from '../../../src/fallback-iptables/render.js';

async function run(argv: string[], stdin?: string): Promise<{ out: string; err: string; code: number }> {
  let out = '';
  let err = '';
  const program = configureExits(new Command('meshcap')).configureOutput({ writeErr: (s) => (err += s), writeOut: (s) => (out += s) });
  registerIptablesCommand(program, {
    write: (s) => (out += s),
    warn: (s) => (err += s),
    ...(stdin !== undefined ? { readStdin: () => stdin } : {}),
  });
  const code = await runCli(program, ['node', 'meshcap', ...argv], { err: (s) => (err += s) });
  return { out, err, code };
}

const INJECTED = { 'sidecar.istio.io/status': '{"containers":["istio-proxy"]}' };

describe('meshcap iptables render', () => {
  const flags = ['-p', '15001', '-z', '15006', '-u', '1337', '-m', 'REDIRECT', '-i', '*', '-b', '*', '-d', '15020', '-q', '8080'];

  it('parses istio-iptables short flags through commander', async () => {
    const { out, code } = await run(['iptables', 'render', ...flags]);
    expect(code).toBe(0);
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
      metadata: { name: 'p', annotations: { ...INJECTED, 'traffic.sidecar.istio.io/excludeOutboundPorts': '5555' } },
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

  it('reads the pod from stdin with --pod -', async () => {
    const pod = { kind: 'Pod', metadata: { name: 'p', annotations: { ...INJECTED, 'traffic.sidecar.istio.io/excludeOutboundPorts': '5555' } }, spec: { containers: [{ name: 'istio-proxy' }] } };
    const r = await run(['iptables', 'render', '--pod', '-'], stringify(pod));
    expect(r.code).toBe(0);
    expect(r.out).toContain('-A ISTIO_OUTPUT -p tcp --dport 5555 -j RETURN\n');
  });

  describe('a manifest with wrongly typed fields names the field (exit 1), not JavaScript internals', () => {
    const cases: [string, string, RegExp][] = [
      ['an unquoted number as annotation value',
        'kind: Pod\nmetadata:\n  name: p\n  annotations:\n    sidecar.istio.io/status: "{}"\n    traffic.sidecar.istio.io/excludeOutboundPorts: 5555\nspec:\n  containers: [{name: istio-proxy}]\n',
        /metadata\.annotations\["traffic\.sidecar\.istio\.io\/excludeOutboundPorts"\] must be a string, got the number 5555 \(quote it/],
      ['containers: 5', 'kind: Pod\nmetadata: {name: p}\nspec:\n  containers: 5\n', /spec\.containers must be a list, got the number 5$/m],
      ['containers: [null]', 'kind: Pod\nmetadata: {name: p}\nspec:\n  containers: [null]\n', /spec\.containers\[0\] must be a mapping \(a container\), got null/],
      ['a container without a name', 'kind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{image: x}]\n', /spec\.containers\[0\]\.name is required/],
      ['runAsUser as a string', 'kind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: istio-proxy, securityContext: {runAsUser: "1000"}}]\n', /spec\.containers\[0\]\.securityContext\.runAsUser must be an integer/],
      ['an env value as a boolean', 'kind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: istio-proxy, env: [{name: X, value: true}]}]\n', /spec\.containers\[0\]\.env\[0\]\.value must be a string/],
    ];
    for (const [what, yaml, message] of cases) {
      it(what, async () => {
        const r = await run(['iptables', 'render', '--pod', '-'], yaml);
        expect(r.code).toBe(1);
        expect(r.err).toMatch(message);
        expect(r.err).not.toMatch(/is not a function|Cannot read prop|TypeError|\n\s+at /);
        expect(r.err).not.toMatch(/--help/);
      });
    }
  });

  it('a non-Pod file or an empty one is refused with what it is (exit 1)', async () => {
    const svc = await run(['iptables', 'render', '--pod', '-'], 'kind: Service\nmetadata: {name: s}\n');
    expect(svc.code).toBe(1);
    expect(svc.err).toMatch(/stdin is a Service, not a Pod/);
    const empty = await run(['iptables', 'render', '--pod', '-'], '');
    expect(empty.code).toBe(1);
    expect(empty.err).toMatch(/empty/);
    const list = await run(['iptables', 'render', '--pod', '-'], '- 1\n- 2\n');
    expect(list.code).toBe(1);
    expect(list.err).toMatch(/not a Pod manifest/);
  });

  it('a pod istio-cni would skip is refused with the reason, and rendered with --force (a warning on stderr)', async () => {
    const plain = stringify({ kind: 'Pod', metadata: { name: 'p' }, spec: { containers: [{ name: 'app' }] } });
    const r = await run(['iptables', 'render', '--pod', '-'], plain);
    expect(r.code).toBe(1);
    expect(r.out).toBe('');
    expect(r.err).toMatch(/would not redirect the pod on stdin: no istio-proxy or linkerd-proxy container \(containers: app\); --force renders it anyway/);
    const f = await run(['iptables', 'render', '--pod', '-', '--force'], plain);
    expect(f.code).toBe(0);
    expect(f.out).toContain('-A ISTIO_OUTPUT');
    expect(f.err).toMatch(/warning: the pod on stdin would not be redirected/);
    const init = stringify({ kind: 'Pod', metadata: { name: 'p', annotations: INJECTED }, spec: { initContainers: [{ name: 'istio-init' }], containers: [{ name: 'istio-proxy' }] } });
    expect((await run(['iptables', 'render', '--pod', '-'], init)).err).toMatch(/istio-init init container present/);
  });

  it('prints the warnings Istio prints (an invalid ISTIO_META_DNS_CAPTURE) on stderr, and still renders', async () => {
    const pod = { kind: 'Pod', metadata: { name: 'p', annotations: INJECTED }, spec: { containers: [{ name: 'istio-proxy', env: [{ name: 'ISTIO_META_DNS_CAPTURE', value: 'yes please' }] }] } };
    const r = await run(['iptables', 'render', '--pod', '-'], stringify(pod));
    expect(r.code).toBe(0);
    expect(r.err).toMatch(/warning: cannot parse ISTIO_META_DNS_CAPTURE="yes please"/);
    expect(r.out).not.toContain('15053');
  });

  it('-b 8000-8010 renders as istio-iptables renders it (iptables-restore will reject it), with a warning naming 8000:8010', async () => {
    // istio-iptables passes port lists to iptables verbatim and does not fail
    // before applying them (checked against the real one: test/privileged/istio-diff/)
    const r = await run(['iptables', 'render', '-b', '8000-8010']);
    expect(r.code).toBe(0);
    expect(r.out).toContain('-A ISTIO_INBOUND -p tcp --dport 8000-8010 -j ISTIO_IN_REDIRECT\n');
    expect(r.err).toMatch(/-b, --istio-inbound-ports "8000-8010".*8000:8010/);
    expect((await run(['iptables', 'render', '-o', '1,2-3'])).err).toMatch(/-o, --istio-local-outbound-ports-exclude/);
    const ok = await run(['iptables', 'render', '-b', '8000:8010']);
    expect(ok.code).toBe(0);
    expect(ok.err).toBe('');
    expect(ok.out).toContain('-A ISTIO_INBOUND -p tcp --dport 8000:8010 -j ISTIO_IN_REDIRECT\n');
  });

  it('stray words and --profile/--force without --pod are usage errors (exit 2, with the help hint)', async () => {
    const stray = await run(['iptables', 'render', 'pod.yaml']);
    expect(stray.code).toBe(2);
    expect(stray.err).toMatch(/unexpected argument\(s\) "pod.yaml".*did you mean --pod pod.yaml/);
    expect(stray.err).toMatch(/Run 'meshcap iptables render --help' for usage/);
    const withPod = await run(['iptables', 'render', '--pod', 'x.yaml', 'extra']);
    expect(withPod.code).toBe(2);
    expect(withPod.err).toMatch(/unexpected argument\(s\) "extra"/);
    const profile = await run(['iptables', 'render', '--profile', 'linkerd']);
    expect(profile.code).toBe(2);
    expect(profile.err).toMatch(/--profile only applies to --pod/);
    expect((await run(['iptables', 'render', '--force'])).code).toBe(2);
  });

  it('interface names are limited by IFNAMSIZ in bytes, not characters (a warning: istio-iptables renders them as they are)', async () => {
    const ok = await run(['iptables', 'render', '-k', 'a'.repeat(15)]);
    expect(ok.code).toBe(0);
    expect(ok.err).toBe('');
    // 14 characters, 16 bytes in UTF-8: the kernel refuses it.
    const r = await run(['iptables', 'render', '-k', 'vethé'.repeat(2) + 'abcd']);
    expect(r.code).toBe(0);
    expect(r.out).toContain(`-i ${'vethé'.repeat(2)}abcd`);
    expect(r.err).toMatch(/is not a valid interface name/);
  });
});
