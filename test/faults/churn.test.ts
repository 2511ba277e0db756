// Churn and leaks (docs/reliability.md): ADD/DEL cycles through the real
// meshcap-cni binary and a `meshcap agent` process, 16 at a time, in both
// node modes; meshed pods, pods that are not meshed, and (eBPF node) meshed
// pods that need iptables mode; each slot re-uses its container id; DEL
// without ADD, DEL after the netns is gone, DEL twice, ADD retried, ADD after
// the sandbox was recreated (same container id, new netns), ADD for a pod the
// pod source no longer has, ADD into a netns deleted meanwhile. Afterwards:
// the pin root, every map's entries, the sk_lookup links, the iptables rules
// in each netns and on the host, and the state dir are as before the first
// ADD; the agent holds no more fds, netns references or threads than after
// the warm-up, and its RSS grew by <= 5 MB.
// CI: 200 cycles per mode; npm run test:faults: 1,000 per mode.
import { existsSync, readdirSync, mkdtempSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { stringify } from 'yaml';
import type { V1Pod } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentProcess, type ProcFigures, endAgentRun } from '../helpers/agent-process.js';
import { MODES, type TestMode } from '../helpers/datapaths.js';
import { Lab, testPinRoot } from '../helpers/lab.js';
import { istioPod } from '../helpers/pods.js';
import { cni, requireCniBinary, type CniRun } from '../privileged/agent/cni-harness.js';

const CYCLES = process.env.MESHCAP_FAULTS_LONG === '1' ? 1000 : 200;
const PARALLEL = 16;
// The agent's RSS climbs over the first ~200 cycles (V8 sizing its heap and
// malloc its arenas to the load: libbpf loads the per-pod object on the libuv
// pool) and is flat after that; growth is measured from there. The agent runs
// with the DaemonSet's environment (MALLOC_ARENA_MAX=1, its NODE_OPTIONS). The figure
// prints RSS after each fifth of the run so a leak (growth per cycle) shows.
const WARMUP = 200;
const RSS_GROWTH_MAX_KB = 5 * 1024;

type Kind = 'meshed' | 'plain' | 'fallback';
const SCENARIOS = ['add-del', 'del-only', 'del-netns-gone', 'del-twice', 'add-twice', 'sandbox-recreated', 'pod-deleted', 'add-netns-gone'] as const;
type Scenario = (typeof SCENARIOS)[number];

function plainPod(name: string): V1Pod {
  return { apiVersion: 'v1', kind: 'Pod', metadata: { name, namespace: 'default' }, spec: { containers: [{ name: 'app', image: 'app' }] } };
}

/** Deterministic, so a failing run can be repeated (MESHCAP_CHURN_SEED). */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

async function mapEntries(pinRoot: string): Promise<Record<string, number>> {
  const dir = path.join(pinRoot, 'maps');
  const out: Record<string, number> = {};
  for (const m of readdirSync(dir).sort()) {
    // (bpftool exits non-zero after an empty sk_storage dump, having printed [])
    const r = await execa('bpftool', ['-j', 'map', 'dump', 'pinned', path.join(dir, m)], { reject: false });
    try {
      out[m] = (JSON.parse(r.stdout) as unknown[]).length;
    } catch {
      throw new Error(`bpftool map dump ${m}: exit ${r.exitCode}: ${r.stderr}`);
    }
  }
  return out;
}

function pins(root: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      out.push(path.relative(root, p));
      if (e.isDirectory()) walk(p);
    }
  };
  walk(root);
  return out.sort();
}

async function iptablesLines(ns?: string): Promise<string[]> {
  const lines: string[] = [];
  for (const bin of ['iptables-save', 'ip6tables-save']) {
    const r = ns ? await execa('ip', ['netns', 'exec', ns, bin], { reject: false }) : await execa(bin, [], { reject: false });
    if (r.exitCode !== 0) throw new Error(`${bin}${ns ? ` in ${ns}` : ''}: ${r.stderr}`);
    lines.push(...r.stdout.split('\n').filter((l) => /ISTIO|meshcap/i.test(l)));
  }
  return lines;
}

/** sk_lookup links attached to any of these netns inodes. */
async function netnsLinks(inodes: Set<number>): Promise<number> {
  const { stdout } = await execa('bpftool', ['-j', 'link', 'show']);
  return (JSON.parse(stdout) as { type: string; netns_ino?: number }[]).filter((l) => l.type === 'netns' && inodes.has(l.netns_ino ?? -1)).length;
}

for (const mode of MODES) {
  describe(`churn: ${CYCLES} ADD/DEL cycles, ${PARALLEL} in parallel (${mode} node)`, () => {
    const lab = new Lab();
    const pinRoot = testPinRoot();
    let tmp: string;
    let agent: AgentProcess;
    let socket: string;
    let stateDir: string;
    const inodes = new Set<number>();
    const slots: { name: string; path: string; gone: boolean }[] = [];
    let seq = 0;

    const newNetns = async (slot: number) => {
      const ns = await lab.netns(`ch${slot}x${seq++}`);
      inodes.add(statSync(ns.path).ino);
      slots[slot] = { ...ns, gone: false };
    };
    const dropNetns = async (slot: number) => {
      await execa('ip', ['netns', 'del', slots[slot]!.name]);
      slots[slot]!.gone = true;
    };

    beforeAll(async () => {
      requireCniBinary();
      tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-churn-'));
      const pods: V1Pod[] = [];
      for (let s = 0; s < PARALLEL; s++) {
        pods.push(istioPod({ name: `meshed-${s}` }), plainPod(`plain-${s}`));
        // a meshed pod eBPF mode cannot honour: iptables mode on an eBPF node
        pods.push(istioPod({ name: `fallback-${s}`, annotations: { 'traffic.sidecar.istio.io/excludeInterfaces': 'net9' } }));
      }
      const podsFile = path.join(tmp, 'pods.yaml');
      writeFileSync(podsFile, pods.map((p) => stringify(p)).join('---\n'));
      socket = path.join(tmp, 'run', 'cni.sock');
      stateDir = path.join(tmp, 'state');
      for (let s = 0; s < PARALLEL; s++) await newNetns(s);
      // with the DaemonSet's MALLOC_ARENA_MAX=1: with glibc's default (8 arenas
      // per CPU) the pool's background loads on libuv threads grew arenas past
      // the warm-up on a loaded machine (CI: +16.8 MB, flat after 80 cycles)
      agent = await AgentProcess.start({ pods: podsFile, socket, pinRoot, stateDir, mode, podWaitMs: 300, extraArgs: ['--metrics-addr', '127.0.0.1:0'], gcOnSignal: true, daemonSetEnv: true });
    }, 120_000);

    afterAll(() => endAgentRun({ agent, lab, pinRoot, tmp }));

    /** One cycle on a slot; returns what went differently than a runtime must see. */
    async function cycle(slot: number, r: () => number): Promise<{ scenario: Scenario; kind: Kind; problems: string[] }> {
      const scenario = SCENARIOS[Math.floor(r() * SCENARIOS.length)]!;
      const kinds: Kind[] = mode === 'ebpf' ? ['meshed', 'plain', 'fallback'] : ['meshed', 'plain'];
      const kind = kinds[Math.floor(r() * kinds.length)]!;
      const problems: string[] = [];
      const call = (pod = `${kind}-${slot}`) => ({ socket, containerId: `churn-${slot}`, netns: slots[slot]!.path, pod, podAddress: `198.18.${100 + slot}.${1 + (seq % 250)}/24` });
      const expectRun = (what: string, run: CniRun, exit: number, code?: number) => {
        const got = run.exitCode === 0 ? 0 : (run.json?.code as number | undefined);
        if (run.exitCode !== exit || (code !== undefined && got !== code)) problems.push(`${scenario}/${kind} ${what}: exit ${run.exitCode}, ${run.stdout.slice(0, 300)}${run.failure ? ` (${run.failure.slice(0, 300)})` : ""}`);
      };
      switch (scenario) {
        case 'add-del': {
          expectRun('ADD', await cni('ADD', call()), 0);
          // a meshed pod is recorded (the leak checks below are not vacuous)
          const recorded = existsSync(path.join(stateDir, `churn-${slot}@eth0.json`));
          if (recorded !== (kind !== 'plain')) problems.push(`${scenario}/${kind}: state record ${recorded ? 'present' : 'missing'} after ADD`);
          expectRun('DEL', await cni('DEL', call()), 0);
          break;
        }
        case 'del-only':
          expectRun('DEL without ADD', await cni('DEL', call()), 0);
          break;
        case 'del-netns-gone':
          expectRun('ADD', await cni('ADD', call()), 0);
          await dropNetns(slot);
          expectRun('DEL, netns gone', await cni('DEL', call()), 0);
          await newNetns(slot);
          break;
        case 'del-twice':
          expectRun('ADD', await cni('ADD', call()), 0);
          expectRun('DEL', await cni('DEL', call()), 0);
          expectRun('second DEL', await cni('DEL', call()), 0);
          break;
        case 'add-twice':
          expectRun('ADD', await cni('ADD', call()), 0);
          expectRun('ADD retried', await cni('ADD', call()), 0);
          expectRun('DEL', await cni('DEL', call()), 0);
          break;
        case 'sandbox-recreated': {
          // the old sandbox's netns goes without a DEL; the same container id comes back in a new one
          expectRun('ADD', await cni('ADD', call()), 0);
          await dropNetns(slot);
          await newNetns(slot);
          expectRun('ADD in the new netns', await cni('ADD', call()), 0);
          expectRun('DEL', await cni('DEL', call()), 0);
          break;
        }
        case 'pod-deleted':
          // the pod object is gone from the API before its ADD: try again later, nothing set up
          expectRun('ADD for a deleted pod', await cni('ADD', call(`deleted-${slot}`)), 1, 11);
          expectRun('DEL', await cni('DEL', call(`deleted-${slot}`)), 0);
          break;
        case 'add-netns-gone': {
          await dropNetns(slot);
          const add = await cni('ADD', call());
          // a pod that is not meshed needs nothing in its netns; a meshed one cannot be set up
          if (kind === 'plain') expectRun('ADD, netns gone', add, 0);
          else expectRun('ADD, netns gone', add, 1, 100);
          expectRun('DEL, netns gone', await cni('DEL', call()), 0);
          await newNetns(slot);
          break;
        }
      }
      return { scenario, kind, problems };
    }

    async function run(n: number, seed: number): Promise<{ problems: string[]; scenarios: Record<string, number> }> {
      let started = 0;
      const problems: string[] = [];
      const scenarios: Record<string, number> = {};
      await Promise.all(Array.from({ length: PARALLEL }, async (_, slot) => {
        const r = rng(seed + slot);
        while (started < n) {
          started++;
          const c = await cycle(slot, r);
          scenarios[c.scenario] = (scenarios[c.scenario] ?? 0) + 1;
          problems.push(...c.problems);
        }
      }));
      return { problems, scenarios };
    }

    /** The agent's V8 heap in use and its external (Buffer, addon) memory, from its /metrics. */
    async function heapMb(): Promise<string> {
      const addr = agent.logs.find((l) => l.msg === 'meshcap agent ready')?.metrics as string;
      // (no keep-alive: an idle HTTP connection would count as an extra fd)
      const text = await (await fetch(`http://${addr}/metrics`, { headers: { connection: 'close' } })).text();
      const v = (name: string) => Number(new RegExp(`^meshcap_agent_${name} ([\\d.e+]+)`, 'm').exec(text)?.[1] ?? NaN) / 2 ** 20;
      return `${v('nodejs_heap_size_used_bytes').toFixed(1)}/${v('nodejs_heap_size_total_bytes').toFixed(1)}/${v('nodejs_external_memory_bytes').toFixed(1)}`;
    }

    /**
     * The agent at rest: in-flight connections closed, and a full GC run
     * (RSS swings by tens of MB with V8's GC timing under load, so RSS is
     * compared at rest: after the GC, the lowest over 2 s).
     */
    async function settled(base?: ProcFigures): Promise<ProcFigures> {
      let f = agent.figures();
      for (let i = 0; base && i < 20 && (f.fds > base.fds || f.threads > base.threads); i++) {
        await new Promise((res) => setTimeout(res, 100));
        f = agent.figures();
      }
      await agent.collectGarbage();
      let rssKb = agent.figures().rssKb;
      for (let i = 0; i < 4; i++) {
        await new Promise((res) => setTimeout(res, 500));
        rssKb = Math.min(rssKb, agent.figures().rssKb);
      }
      return { ...f, rssKb };
    }

    it('every cycle answered as a runtime must see it; afterwards nothing extra in the kernel, the state dir or the agent', async () => {
      const seed = Number(process.env.MESHCAP_CHURN_SEED ?? 4242);
      const kernel0 = {
        pins: mode === 'ebpf' ? pins(pinRoot) : [],
        maps: mode === 'ebpf' ? await mapEntries(pinRoot) : {},
        hostIptables: await iptablesLines(),
      };
      const warm = await run(WARMUP, seed + 1000);
      expect(warm.problems).toEqual([]);
      const proc0 = await settled();

      const t0 = performance.now();
      // in five parts, with the agent's RSS after each: growth that levels off
      // is the allocator sizing itself, growth per cycle is a leak
      const problems: string[] = [];
      const scenarios: Record<string, number> = {};
      const rssSeries: number[] = [proc0.rssKb];
      const heapSeries: string[] = [await heapMb()];
      for (let part = 0; part < 5; part++) {
        const r = await run(CYCLES / 5, seed + part * 100);
        problems.push(...r.problems);
        for (const [k, v] of Object.entries(r.scenarios)) scenarios[k] = (scenarios[k] ?? 0) + v;
        await agent.collectGarbage();
        rssSeries.push(agent.figures().rssKb);
        heapSeries.push(await heapMb());
      }
      const s = (performance.now() - t0) / 1000;
      expect(problems.slice(0, 20), `${problems.length} problems`).toEqual([]);
      expect(agent.alive()).toBe(true);

      const proc1 = await settled(proc0);
      const live = slots.filter((x) => !x.gone);
      const leftRules: string[] = [];
      for (const x of live) leftRules.push(...(await iptablesLines(x.name)).map((l) => `${x.name}: ${l}`));
      const kernel1 = {
        pins: mode === 'ebpf' ? pins(pinRoot) : [],
        maps: mode === 'ebpf' ? await mapEntries(pinRoot) : {},
        hostIptables: await iptablesLines(),
      };
      // (only the netns that still exist: a deleted one's inode number is
      // soon reused by another netns on this machine, with its own links; a
      // link kept past its netns would show as an agent fd or a pin)
      const links = await netnsLinks(new Set(live.map((x) => statSync(x.path).ino)));
      const records = readdirSync(stateDir);
      const meshedAdds = agent.logs.filter((l) => l.verb === 'ADD' && l.decision === 'meshed');
      const byMode = { ebpf: meshedAdds.filter((l) => l.mode === 'ebpf').length, iptables: meshedAdds.filter((l) => l.mode === 'iptables').length };
      const rssGrowthKb = proc1.rssKb - proc0.rssKb;

      console.log([
        `churn (${mode} node): ${CYCLES} cycles in ${s.toFixed(1)} s (${(CYCLES / s).toFixed(1)}/s), ${PARALLEL} in parallel, scenarios ${JSON.stringify(scenarios)}`,
        `  meshed ADDs (incl. warm-up): eBPF ${byMode.ebpf}, iptables ${byMode.iptables}; netns made ${inodes.size}`,
        `  extra after: pins ${kernel1.pins.length - kernel0.pins.length}, map entries ${Object.values(kernel1.maps).reduce((a, b) => a + b, 0) - Object.values(kernel0.maps).reduce((a, b) => a + b, 0)}, sk_lookup links ${links}, pod netns iptables lines ${leftRules.length}, host iptables lines ${kernel1.hostIptables.length - kernel0.hostIptables.length}, state records ${records.length}`,
        `  agent: fds ${proc0.fds} -> ${proc1.fds}, threads ${proc0.threads} -> ${proc1.threads}, netns refs ${proc0.netns.length} -> ${proc1.netns.length}, RSS ${(proc0.rssKb / 1024).toFixed(1)} -> ${(proc1.rssKb / 1024).toFixed(1)} MB (${rssGrowthKb >= 0 ? '+' : ''}${(rssGrowthKb / 1024).toFixed(2)} MB), after each fifth: ${rssSeries.map((k) => (k / 1024).toFixed(1)).join(' ')} MB; V8 heap used/total/external ${heapSeries.join(' ')} MB`,
      ].join('\n'));

      // the cycles did mesh pods (in both datapaths on an eBPF node)
      expect(byMode[mode]).toBeGreaterThan(CYCLES / 10);
      if (mode === 'ebpf') expect(byMode.iptables).toBeGreaterThan(CYCLES / 20);
      expect(kernel1.pins).toEqual(kernel0.pins);
      expect(kernel1.maps).toEqual(kernel0.maps);
      expect(links).toBe(0);
      expect(leftRules).toEqual([]);
      expect(kernel1.hostIptables).toEqual(kernel0.hostIptables);
      expect(records).toEqual([]);
      expect(proc1.fds, JSON.stringify({ before: proc0.fdKinds, after: proc1.fdKinds })).toBeLessThanOrEqual(proc0.fds);
      expect(proc1.threads).toBeLessThanOrEqual(proc0.threads);
      expect(proc1.netns).toEqual(proc0.netns);
      expect(rssGrowthKb).toBeLessThanOrEqual(RSS_GROWTH_MAX_KB);
    }, 1_800_000);
  });
}
