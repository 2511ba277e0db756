#!/usr/bin/env node
// npm run bench:reconcile — how long a node stays uncaptured after a datapath
// reload: N meshed pods (network namespaces this script made) are added
// through the agent, the agent is stopped, the datapath is lost (eBPF:
// `meshcap uninstall` removes every pin and map; iptables: the rules in every
// pod netns are flushed), and a new agent is started on the same state dir.
// Measured: agent start to ready (the reconcile that restores every pod runs
// before ready), the reconcile alone, and one steady self-check pass with
// nothing to repair (the cost the agent pays every --self-check-interval).
// Needs root and `npm run build`.
//
//   node scripts/bench-reconcile.mjs [--pods 1,100,1000] [--modes ebpf,iptables] [--json FILE]
//
// Everything it makes (netns, pins, state dir) is removed at the end, also on
// Ctrl-C. The namespaces have no links: no traffic leaves any of them.
import { createStepProgress } from './lib/progress.mjs';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const dist = (p) => path.join(root, 'dist', p);
if (!existsSync(dist('agent/agent.js'))) throw new Error(`${dist('agent/agent.js')} is missing: npm run build`);
if (process.getuid?.() !== 0) throw new Error('run as root: the bench makes network namespaces and loads BPF programs');

const { values: opt } = parseArgs({
  options: {
    pods: { type: 'string', default: '1,100,1000' },
    modes: { type: 'string', default: 'ebpf,iptables' },
    json: { type: 'string' },
  },
});
const SIZES = opt.pods.split(',').map(Number);
if (!SIZES.every((n) => Number.isInteger(n) && n >= 1 && n <= 5000)) throw new Error('--pods: comma-separated counts from 1 to 5000');
const MODES = opt.modes.split(',');
for (const m of MODES) if (m !== 'ebpf' && m !== 'iptables') throw new Error(`--modes: ebpf and/or iptables, not ${m}`);

const { pino } = await import('pino');
const { stringify } = await import('yaml');
const { startAgent } = await import(dist('agent/agent.js'));
const { FileSource } = await import(dist('kube/file-source.js'));
const { uninstallDatapath } = await import(dist('loader/datapath.js'));
const { removeCapture } = await import(dist('fallback-iptables/apply.js'));
const { configOf } = await import(dist('agent/state-store.js'));

const id = `${process.pid}`;
const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-bench-reconcile-'));
const pinRoot = `/sys/fs/bpf/meshcap-bench-${id}`;
const made = [];
let agent;
async function cleanup() {
  await agent?.close().catch(() => undefined);
  agent = undefined;
  try { uninstallDatapath(pinRoot); } catch { /* not loaded */ }
  for (const ns of made.splice(0)) {
    try { execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' }); } catch { /* gone */ }
  }
  rmSync(tmp, { recursive: true, force: true });
}
process.once('SIGINT', () => { void cleanup().finally(() => process.exit(130)); });

const logger = pino({ level: 'silent' });
const maxPods = Math.max(...SIZES);
const podName = (i) => `rc-${i}`;
const podsFile = path.join(tmp, 'pods.yaml');
writeFileSync(podsFile, Array.from({ length: maxPods }, (_, i) => stringify({
  apiVersion: 'v1', kind: 'Pod',
  metadata: { name: podName(i), namespace: 'default', annotations: { 'sidecar.istio.io/status': '{"containers":["istio-proxy"]}' } },
  spec: { containers: [{ name: 'app', image: 'app' }, { name: 'istio-proxy', image: 'proxyv2' }] },
})).join('---\n'));

const start = (mode, stateDir) => startAgent({
  socketPath: path.join(tmp, `cni-${mode}.sock`),
  pinRoot, mode, stateDir,
  podSource: new FileSource({ path: podsFile, logger }),
  excludeNamespaces: ['kube-system'], logger, podWaitMs: 5000, selfCheckMs: 0,
});

const t = () => performance.now();
const results = [];
try {
  process.stderr.write(`creating ${maxPods} network namespaces...\n`);
  for (let i = 0; i < maxPods; i++) {
    const name = `mcrc-${id}-${i}`;
    execFileSync('ip', ['netns', 'add', name]);
    made.push(name);
  }
  const progress = createStepProgress({ name: 'bench:reconcile', total: MODES.length * SIZES.length });
  for (const mode of MODES) {
    for (const n of SIZES) {
      progress.step(`${mode}, ${n} pods: register, lose the datapath, restart the agent`);
      const stateDir = path.join(tmp, `state-${mode}-${n}`);
      agent = await start(mode, stateDir);
      for (let i = 0; i < n; i++) {
        await agent.handlers.add({
          command: 'ADD', containerId: `c${i}`, netns: `/var/run/netns/${made[i]}`, ifname: 'eth0', args: {},
          podNamespace: 'default', podName: podName(i), cniVersion: '1.1.0',
          config: { cniVersion: '1.1.0', name: 'bench', type: 'meshcap-cni', prevResult: { cniVersion: '1.1.0', ips: [{ address: `198.18.${(i >> 8) & 255}.${(i & 255) || 1}/32` }] } },
        });
      }
      const records = agent.store.list();
      await agent.close();
      agent = undefined;
      // The loss: what an upgrade that recreates the maps, or uninstall + load, does.
      if (mode === 'ebpf') uninstallDatapath(pinRoot);
      else for (const r of records) await removeCapture(r.netns, configOf(r), { logger });
      const t0 = t();
      agent = await start(mode, stateDir);
      const readyMs = t() - t0;
      const s = agent.startup;
      if (s.restored !== n || s.failed !== 0) throw new Error(`${mode} ${n} pods: restored ${s.restored}, failed ${s.failed}`);
      const p0 = t();
      const steady = await agent.selfCheck();
      const steadyMs = t() - p0;
      if (steady.ok !== n) throw new Error(`${mode} ${n} pods: steady self-check found ${n - steady.ok} pods not ok`);
      const row = { mode, pods: n, startToReadyMs: Math.round(readyMs), reconcileMs: s.ms, perPodMs: +(s.ms / n).toFixed(2), steadySelfCheckMs: Math.round(steadyMs) };
      results.push(row);
      progress.log(`${mode.padEnd(8)} ${String(n).padStart(5)} pods: agent start -> ready (all restored) ${String(row.startToReadyMs).padStart(6)} ms; reconcile ${String(row.reconcileMs).padStart(6)} ms (${row.perPodMs} ms/pod); steady self-check ${String(row.steadySelfCheckMs).padStart(6)} ms`);
      // Next size starts from nothing.
      for (const r of agent.store.list()) await agent.handlers.del({ command: 'DEL', containerId: r.containerId, netns: r.netns, ifname: r.ifname, args: {}, podNamespace: r.podNamespace, podName: r.podName, cniVersion: '1.1.0', config: { cniVersion: '1.1.0', name: 'bench', type: 'meshcap-cni' } });
      await agent.close();
      agent = undefined;
    }
  }
  progress.done();
  if (opt.json) writeFileSync(opt.json, JSON.stringify({ date: new Date().toISOString(), kernel: os.release(), cpus: os.cpus().length, results }, null, 1) + '\n');
} finally {
  await cleanup();
}
