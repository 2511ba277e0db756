// Restart and reboot (docs/reliability.md): a new `meshcap agent` process on
// the same state adopts every pod from the pins and its records (after
// SIGTERM and after SIGKILL) with the datapath byte-equal; truncated,
// corrupt and foreign files in the state dir and foreign pins under the pin
// root are reported and left alone, and no start-up step fails or takes a
// pod's capture away because of them; a simulated reboot (pins and netns
// gone, records on disk) reconciles to an empty, consistent state.
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { stringify } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentProcess, endAgentRun } from '../helpers/agent-process.js';
import { MODES } from '../helpers/datapaths.js';
import { Lab, testPinRoot } from '../helpers/lab.js';
import { istioPod } from '../helpers/pods.js';
import { cni, requireCniBinary, type CniCall } from '../privileged/agent/cni-harness.js';
import { projectRoot } from '../../src/paths.js';

const PODS = 4;

function pinsUnder(root: string): string[] {
  if (!existsSync(root)) return [];
  const out: string[] = [];
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      out.push(path.relative(root, path.join(d, e.name)));
      if (e.isDirectory()) walk(path.join(d, e.name));
    }
  };
  walk(root);
  return out.sort();
}

for (const mode of MODES) {
  describe(`restart and reboot (${mode} node)`, () => {
    const lab = new Lab();
    const pinRoot = testPinRoot();
    let tmp: string;
    let podsFile: string;
    let socket: string;
    let stateDir: string;
    let agent: AgentProcess;
    const nss: { name: string; path: string; ino: number }[] = [];
    const calls: CniCall[] = [];

    const start = () => AgentProcess.start({ pods: podsFile, socket, pinRoot, stateDir, mode });
    const ready = (a: AgentProcess) => a.logs.find((l) => l.msg === 'meshcap agent ready')!;

    /** Everything a pod's capture is made of, as text to compare. */
    async function datapath(): Promise<Record<string, unknown>> {
      const out: Record<string, unknown> = { pins: pinsUnder(pinRoot) };
      if (mode === 'ebpf') {
        const maps: Record<string, unknown> = {};
        for (const m of readdirSync(path.join(pinRoot, 'maps')).sort()) {
          const r = await execa('bpftool', ['-j', 'map', 'dump', 'pinned', path.join(pinRoot, 'maps', m)], { reject: false });
          maps[m] = (JSON.parse(r.stdout) as unknown[]).map((e) => JSON.stringify(e)).sort();
        }
        out.maps = maps;
        const { stdout } = await execa('bpftool', ['-j', 'link', 'show']);
        const inos = new Set(nss.map((n) => n.ino));
        out.links = (JSON.parse(stdout) as { id: number; type: string; netns_ino?: number; prog_id: number }[])
          .filter((l) => l.type === 'netns' && inos.has(l.netns_ino ?? -1)).map((l) => `${l.id} ${l.netns_ino} ${l.prog_id}`).sort();
      }
      for (const n of nss) {
        if (!existsSync(n.path)) continue;
        const { stdout } = await execa('ip', ['netns', 'exec', n.name, 'iptables-save']);
        out[`rules ${n.name}`] = stdout.split('\n').filter((l) => l.startsWith('-') || l.startsWith(':')).map((l) => l.replace(/\[\d+:\d+\]/, ''));
      }
      out.records = readdirSync(stateDir, { withFileTypes: true }).filter((e) => e.isFile() && e.name.endsWith('.json')).map((e) => e.name).sort()
        .map((f) => readFileSync(path.join(stateDir, f), 'utf8'));
      return out;
    }

    beforeAll(async () => {
      requireCniBinary();
      tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-restart-'));
      podsFile = path.join(tmp, 'pods.yaml');
      const pods = Array.from({ length: PODS }, (_, i) => istioPod({
        name: `r${i}`,
        // on an eBPF node, one pod needs iptables mode
        ...(i === PODS - 1 ? { annotations: { 'traffic.sidecar.istio.io/excludeInterfaces': 'net9' } } : {}),
      }));
      writeFileSync(podsFile, pods.map((p) => stringify(p)).join('---\n'));
      socket = path.join(tmp, 'run', 'cni.sock');
      stateDir = path.join(tmp, 'state');
      for (let i = 0; i < PODS; i++) {
        const ns = await lab.netns(`rs${i}`);
        nss.push({ ...ns, ino: statSync(ns.path).ino });
        calls.push({ socket, containerId: `c-r${i}`, netns: ns.path, pod: `r${i}`, podAddress: `198.18.70.${i + 1}/24` });
      }
      agent = await start();
      for (const c of calls) {
        const r = await cni('ADD', c);
        expect(r.exitCode, r.stdout).toBe(0);
      }
    }, 120_000);

    afterAll(() => endAgentRun({ agent, lab, pinRoot, tmp }));

    it('a new agent after SIGTERM, then after SIGKILL, adopts every pod: nothing restored, dropped or swept, the datapath byte-equal', async () => {
      const before = await datapath();
      expect(Object.keys(before).length).toBeGreaterThan(2);
      for (const signal of ['SIGTERM', 'SIGKILL'] as const) {
        if (signal === 'SIGTERM') await agent.stop();
        else {
          agent.proc.kill('SIGKILL');
          await agent.proc;
        }
        agent = await start();
        expect(ready(agent), signal).toMatchObject({ attachments: PODS, restored: 0, dropped: 0, notRestored: 0, orphansSwept: 0 });
        expect(await datapath(), signal).toEqual(before);
        for (const c of calls) expect((await cni('CHECK', c)).exitCode, `${signal} ${c.pod}`).toBe(0);
      }
    });

    it('truncated, corrupt, old-version and foreign files in the state dir are reported and left; the pod whose record is truncated keeps its capture', async () => {
      await agent.stop();
      const victim = path.join(stateDir, 'c-r0@eth0.json');
      const saved = path.join(tmp, 'saved-record.json');
      copyFileSync(victim, saved);
      const full = readFileSync(victim, 'utf8');
      writeFileSync(victim, full.slice(0, Math.floor(full.length / 2))); // a crash mid-write without the tmp+rename
      const foreign: Record<string, string> = {
        'garbage.json': '{not json',
        'old.json': JSON.stringify({ version: 99, containerId: 'x' }),
        'empty.json': '',
        'notes.txt': 'an operator\'s notes',
        'c-x@eth0.json.123.0.tmp': '{"half":',
      };
      for (const [f, text] of Object.entries(foreign)) writeFileSync(path.join(stateDir, f), text);
      mkdirSync(path.join(stateDir, 'dir.json'));
      const before = await datapath();

      agent = await start();
      const warned = agent.logs.filter((l) => l.msg === 'ignoring an unreadable state record').map((l) => String(l.problem));
      for (const f of ['c-r0@eth0.json', 'garbage.json', 'old.json', 'empty.json', 'dir.json']) {
        expect(warned.some((w) => w.includes(path.join(stateDir, f))), `${f} reported: ${JSON.stringify(warned)}`).toBe(true);
      }
      expect(agent.logs.some((l) => l.msg === 'not sweeping orphan map entries: unreadable state records may own them; fix or remove those files')).toBe(true);
      expect(ready(agent)).toMatchObject({ attachments: PODS - 1, dropped: 0, notRestored: 0, orphansSwept: 0 });
      // nothing of anyone else's touched; the victim's capture is still in the kernel
      for (const f of [...Object.keys(foreign), 'dir.json']) expect(existsSync(path.join(stateDir, f)), f).toBe(true);
      const after = await datapath();
      expect({ ...after, records: undefined }).toEqual({ ...before, records: undefined });
      // CHECK says what is wrong for the pod without a readable record
      const check = await cni('CHECK', calls[0]!);
      expect(check.exitCode).toBe(1);
      expect(check.json).toMatchObject({ code: 101 });

      // the record put back, the agent started again: all adopted, as before
      await agent.stop();
      copyFileSync(saved, victim);
      for (const f of Object.keys(foreign)) rmSync(path.join(stateDir, f));
      rmSync(path.join(stateDir, 'dir.json'), { recursive: true });
      agent = await start();
      expect(ready(agent)).toMatchObject({ attachments: PODS, restored: 0, dropped: 0, notRestored: 0, orphansSwept: 0 });
      for (const c of calls) expect((await cni('CHECK', c)).exitCode, c.pod).toBe(0);
    });

    // (pins exist only on an eBPF node)
    if (mode === 'ebpf') it('foreign pins under the pin root are left alone', async () => {
      await agent.stop();
      const pins = [path.join(pinRoot, 'foreign-map'), path.join(pinRoot, 'pods', '4242', 'inbound')];
      mkdirSync(path.dirname(pins[1]!), { recursive: true });
      for (const p of pins) await execa('bpftool', ['map', 'create', p, 'type', 'hash', 'key', '4', 'value', '4', 'entries', '1', 'name', 'foreign']);
      agent = await start();
      expect(ready(agent)).toMatchObject({ attachments: PODS, restored: 0, dropped: 0, notRestored: 0 });
      for (const p of pins) expect(existsSync(p), p).toBe(true);
      for (const c of calls) expect((await cni('CHECK', c)).exitCode, c.pod).toBe(0);
      for (const p of pins) rmSync(p);
      rmSync(path.dirname(pins[1]!), { recursive: true });
    });

    it('a simulated reboot (pins and network namespaces gone, records on disk) reconciles to an empty, consistent state', async () => {
      agent.proc.kill('SIGKILL');
      await agent.proc;
      await execa('node', [path.join(projectRoot, 'bin/meshcap'), 'uninstall', '--pin-root', pinRoot, '--force']);
      for (const n of nss) await execa('ip', ['netns', 'del', n.name]);
      expect(readdirSync(stateDir).filter((f) => f.endsWith('.json'))).toHaveLength(PODS);

      agent = await start();
      expect(ready(agent)).toMatchObject({ attachments: 0, dropped: PODS, notRestored: 0 });
      expect(readdirSync(stateDir)).toEqual([]);
      if (mode === 'ebpf') {
        const after = await datapath();
        // node-level, not pod state: the settings, the shared inbound program's
        // slot and the per-CPU scratch its pods' stubs hand their cookie through
        const nodeLevel = new Set(['mc_settings', 'mc_inbound_tail', 'mc_inbound_arg']);
        for (const [m, entries] of Object.entries(after.maps as Record<string, string[]>)) {
          if (!nodeLevel.has(m)) expect(entries, m).toEqual([]);
        }
        expect(after.maps).toHaveProperty('mc_inbound_tail');
        expect(after.links).toEqual([]);
        expect((after.pins as string[]).filter((p) => p.startsWith('pods/'))).toEqual([]);
      }
      // and the node works: a new pod is captured
      const ns = await lab.netns('rsnew');
      nss.push({ ...ns, ino: statSync(ns.path).ino });
      const c = { ...calls[1]!, containerId: 'c-new', netns: ns.path };
      expect((await cni('ADD', c)).exitCode).toBe(0);
      expect((await cni('CHECK', c)).exitCode).toBe(0);
      expect((await cni('DEL', c)).exitCode).toBe(0);
    });
  });
}
