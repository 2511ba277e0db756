// Every metric deploy/grafana/meshcap-dashboard.json queries exists on a
// running agent (`meshcap agent`) or a running `meshcap install-cni` (the
// DaemonSet's two containers), scraped over HTTP, not only in a registry.
import { execa } from 'execa';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { families, queriedFamilies } from '../../helpers/prometheus.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

/** A free loopback port (install-cni takes host:port, not :0 with a log line). */
async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
  const port = (srv.address() as { port: number }).port;
  await new Promise((r) => srv.close(r));
  return port;
}

/** /metrics of a `meshcap install-cni` chaining into a bridge conflist in a temp dir. */
async function installCniMetrics(dir: string): Promise<string> {
  const conf = path.join(dir, 'net.d');
  const bin = path.join(dir, 'bin');
  mkdirSync(conf);
  mkdirSync(bin);
  writeFileSync(path.join(conf, '10-bridge.conflist'), JSON.stringify({ cniVersion: '1.0.0', name: 'k8s', plugins: [{ type: 'bridge' }] }));
  const port = await freePort();
  const p = execa(process.execPath, [path.join(root, 'bin/meshcap'), 'install-cni', '--cni-conf-dir', conf, '--cni-bin-dir', bin,
    '--agent-socket', path.join(dir, 'cni.sock'), '--metrics-addr', `127.0.0.1:${port}`], { reject: false });
  try {
    for (let i = 0; i < 150; i++) {
      const r = await fetch(`http://127.0.0.1:${port}/metrics`).catch(() => null);
      if (r?.ok) return await r.text();
      await new Promise((res) => setTimeout(res, 100));
    }
    throw new Error(`install-cni served no /metrics in 15 s: ${p.stderr ?? ''}`);
  } finally {
    p.kill('SIGTERM');
    await p;
  }
}

describe('the Grafana dashboard against a running agent and install-cni', () => {
  it('every queried metric is on /metrics', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'meshcap-dash-'));
    writeFileSync(path.join(dir, 'pods.yaml'), '');
    const agent = execa(process.execPath, [path.join(root, 'bin/meshcap'), 'agent', '--standalone', '--pods', path.join(dir, 'pods.yaml'),
      '--mode', 'iptables', '--socket', path.join(dir, 'cni.sock'), '--state-dir', path.join(dir, 'state'), '--metrics-addr', '127.0.0.1:0', '--metrics-per-pod'], { reject: false });
    try {
      const addr = await new Promise<string>((resolve, reject) => {
        let buf = '';
        agent.stdout!.on('data', (d: Buffer) => {
          buf += d.toString();
          const m = /"metrics":"([^"]+)"[^\n]*"msg":"meshcap agent ready"/.exec(buf);
          if (m) resolve(m[1]!);
        });
        setTimeout(() => reject(new Error(`agent not ready in 30 s: ${buf}`)), 30_000);
      });
      const text = await (await fetch(`http://${addr}/metrics`)).text();
      const known = families(text + (await installCniMetrics(dir)));
      const dashboard = JSON.parse(readFileSync(path.join(root, 'deploy/grafana/meshcap-dashboard.json'), 'utf8')) as { panels: { targets: { expr: string }[] }[] };
      const queried = queriedFamilies(dashboard.panels.flatMap((p) => p.targets.map((t) => t.expr)), known);
      expect(queried.length).toBeGreaterThanOrEqual(9);
      expect(queried.filter((n) => !known.has(n))).toEqual([]);
    } finally {
      agent.kill('SIGTERM');
      await agent;
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
