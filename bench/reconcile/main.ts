// npm run bench:reconcile — how long a node stays uncaptured after a datapath
// reload: N meshed pods (network namespaces of this bench's lab) are added
// through the agent, the agent is stopped, the datapath is lost (eBPF:
// uninstall removes every pin and map; iptables: the rules in every pod
// netns are flushed), and a new agent is started on the same state dir.
// Measured: agent start to ready (the reconcile that restores every pod runs
// before ready), the reconcile alone, and one steady self-check pass with
// nothing to repair (the cost the agent pays every --self-check-interval).
// Needs root and the build (npm run build: the addon and the BPF objects).
//
//   node --import ./bench/lib/ts.mjs bench/reconcile/main.ts [--pods 1,100,1000] [--modes ebpf,iptables] [--json FILE]
//
// Everything it makes (netns, pins, state dir) is in one lab (src/lab) and
// removed at the end, also on failure and Ctrl-C. The namespaces have no
// links: no traffic leaves any of them.
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pino } from 'pino';
import { stringify } from 'yaml';
import { parseOptions } from '../../scripts/lib/cli-options.mjs';
import { createStepProgress } from '../../scripts/lib/progress.mjs';
import { cleanupOnSignals, Lab } from '../../src/lab/index.js';
import { projectRoot } from '../../src/paths.js';

if (!existsSync(path.join(projectRoot, 'build/native/Release/meshcap_native.node'))) throw new Error('build/native/Release/meshcap_native.node is missing: npm run build');
if (process.getuid?.() !== 0) throw new Error('run as root: the bench makes network namespaces and loads BPF programs');

const opt = parseOptions(import.meta.url, 'bench:reconcile', {
  pods: { type: 'string', default: '1,100,1000' },
  modes: { type: 'string', default: 'ebpf,iptables' },
  json: { type: 'string' },
});
const SIZES = opt.pods.split(',').map(Number);
if (!SIZES.every((n) => Number.isInteger(n) && n >= 1 && n <= 5000)) throw new Error('--pods: comma-separated counts from 1 to 5000');
const MODES = opt.modes.split(',') as ('ebpf' | 'iptables')[];
for (const m of MODES) if (m !== 'ebpf' && m !== 'iptables') throw new Error(`--modes: ebpf and/or iptables, not ${m}`);

// Loaded after the checks so a missing build fails with the message above (they load the addon).
const { startAgent } = await import('../../src/agent/agent.js');
const { FileSource } = await import('../../src/kube/file-source.js');
const { uninstallDatapath } = await import('../../src/loader/datapath.js');
const { removeCapture } = await import('../../src/fallback-iptables/apply.js');
const { configOf } = await import('../../src/agent/state-store.js');
type Agent = Awaited<ReturnType<typeof startAgent>>;

const lab = new Lab('mcrc', String(process.pid));
const stopOnSignals = cleanupOnSignals(() => lab.close(), (msg) => process.stderr.write(`bench:reconcile: ${msg}\n`));
const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-bench-reconcile-'));
lab.add(`temp dir ${tmp}`, () => rmSync(tmp, { recursive: true, force: true }));
const pinRoot = `/sys/fs/bpf/meshcap-bench-${process.pid}`;
lab.add(`datapath ${pinRoot}`, () => uninstallDatapath(pinRoot));
let agent: Agent | undefined;
lab.add('agent', async () => {
  await agent?.close().catch(() => undefined);
  agent = undefined;
});

const logger = pino({ level: 'silent' });
const maxPods = Math.max(...SIZES);
const podName = (i: number) => `rc-${i}`;
const podsFile = path.join(tmp, 'pods.yaml');
writeFileSync(podsFile, Array.from({ length: maxPods }, (_, i) => stringify({
  apiVersion: 'v1', kind: 'Pod',
  metadata: { name: podName(i), namespace: 'default', annotations: { 'sidecar.istio.io/status': '{"containers":["istio-proxy"]}' } },
  spec: { containers: [{ name: 'app', image: 'app' }, { name: 'istio-proxy', image: 'proxyv2' }] },
})).join('---\n'));

const start = (mode: 'ebpf' | 'iptables', stateDir: string) => startAgent({
  socketPath: path.join(tmp, `cni-${mode}.sock`),
  pinRoot, mode, stateDir,
  podSource: new FileSource({ path: podsFile, logger }),
  excludeNamespaces: ['kube-system'], logger, podWaitMs: 5000, selfCheckMs: 0,
});

const t = () => performance.now();
const results: { mode: string; pods: number; startToReadyMs: number; reconcileMs: number; perPodMs: number; steadySelfCheckMs: number }[] = [];
try {
  process.stderr.write(`creating ${maxPods} network namespaces...\n`);
  // Only `ip netns add`: the agent needs the namespaces to exist, nothing inside them.
  const netns: string[] = [];
  for (let i = 0; i < maxPods; i++) netns.push((await lab.netns(String(i), { lo: false })).path);
  const progress = createStepProgress({ name: 'bench:reconcile', total: MODES.length * SIZES.length });
  for (const mode of MODES) {
    for (const n of SIZES) {
      progress.step(`${mode}, ${n} pods: register, lose the datapath, restart the agent`);
      const stateDir = path.join(tmp, `state-${mode}-${n}`);
      agent = await start(mode, stateDir);
      for (let i = 0; i < n; i++) {
        await agent.handlers.add({
          command: 'ADD', containerId: `c${i}`, netns: netns[i]!, ifname: 'eth0', args: {},
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
} catch (e) {
  console.error(`bench-reconcile: ${(e as Error).message}`);
  process.exitCode = 1;
} finally {
  const steps = await lab.close();
  for (const s of steps.filter((x) => x.error)) console.error(`bench-reconcile: cleanup: ${s.label}: ${s.error}`);
  stopOnSignals();
}
