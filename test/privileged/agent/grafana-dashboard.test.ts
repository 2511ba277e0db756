// Every metric deploy/grafana/meshcap-dashboard.json queries exists on a
// running agent (`meshcap agent`, scraped over HTTP), not only in the registry.
import { execa } from 'execa';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { families, queriedFamilies } from '../../helpers/prometheus.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

describe('the Grafana dashboard against a running agent', () => {
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
      const known = families(text);
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
