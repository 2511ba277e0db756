// Uninstall under load (issue 15, part 6; figures in docs/reliability.md).
// Two meshed pods (the reference proxy as their sidecar) open connections to
// their servers back to back and one keeps a long echo stream open through
// its sidecar. The agent is stopped as deleting the DaemonSet stops it; then
// `meshcap uninstall` refuses, naming both pods, and changes nothing; then
// `meshcap uninstall --force --purge` runs while the connections go on.
// Counted: connections that failed, went through the sidecar or went direct,
// before, during and after the uninstall; the long stream must finish.
// Afterwards nothing of meshcap is left — pins, links, maps, programs at the
// cgroup root, sk_lookup links in the pods, rules in the pods' netns,
// records — and foreign state is byte-equal: a connect4 program attached at
// the same cgroup, a map pinned under meshcap's pin root, iptables chains in
// the pod's netns.
import { existsSync, mkdtempSync, readdirSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { stringify } from 'yaml';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { findCgroup2 } from '../../src/loader/mounts.js';
import * as bpf from '../../src/native/addon.js';
import { projectRoot } from '../../src/paths.js';
import { AgentProcess, endAgentRun } from '../helpers/agent-process.js';
import { podBesideServer } from '../helpers/agent-fixture.js';
import { describeModes } from '../helpers/datapaths.js';
import { Lab, scaled, testPinRoot, type NsAgent } from '../helpers/lab.js';
import { istioPod } from '../helpers/pods.js';
import { cni, requireCniBinary } from '../privileged/agent/cni-harness.js';

const PODS = 2;
/** long enough to outlast the uninstall (about 1,500 rounds/s here) */
const ROUNDS = 15_000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const meshcap = (args: string[]) => execa('node', [path.join(projectRoot, 'bin/meshcap'), ...args], { reject: false });

/** A netns's rules as text (counters stripped): nat, mangle, filter, both families. */
async function rulesOf(ns: string): Promise<string> {
  const out: string[] = [];
  for (const bin of ['iptables-save', 'ip6tables-save']) {
    const r = await execa('ip', ['netns', 'exec', ns, bin]);
    out.push(r.stdout.split('\n').filter((l) => !l.startsWith('#')).map((l) => l.replace(/\[\d+:\d+\]/g, '[-]')).join('\n'));
  }
  return out.join('\n--\n');
}

const bpftoolJson = async <T>(args: string[]): Promise<T> => JSON.parse((await execa('bpftool', ['-j', ...args])).stdout) as T;

describeModes('meshcap uninstall under load, %s mode', (mode) => {
  const lab = new Lab();
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-uninstall-'));
  const opts = { pods: path.join(tmp, 'pods.yaml'), socket: path.join(tmp, 'cni.sock'), pinRoot: testPinRoot(), stateDir: path.join(tmp, 'state'), mode };
  const cgroup = findCgroup2()!;
  let agent: AgentProcess | undefined;
  let foreignLink: number | null = null;
  let foreignProg = 0;
  const foreignPin = path.join(opts.pinRoot, 'lb-backends');
  const pods: { name: string; ip: string; srv: string; netns: { name: string; path: string }; app: NsAgent; proxy: Awaited<ReturnType<Lab['proxy']>>; rules: string }[] = [];

  beforeAll(async () => {
    requireCniBinary();
    // A foreign program at the cgroup meshcap attaches to: a socket load
    // balancer for 198.19.100.10:80 (nothing here connects to it).
    const obj = path.join(tmp, 'socklb.bpf.o');
    await execa('clang', ['-target', 'bpf', '-O2', '-g', '-I', path.join(projectRoot, 'build'), '-idirafter', '/usr/include/x86_64-linux-gnu',
      '-c', path.join(projectRoot, 'test/privileged/datapath/fixtures/socklb.bpf.c'), '-o', obj]);
    const lb = bpf.openObject(obj);
    await lb.load();
    const prog = lb.programs().find((p) => p.name === 'lb_connect4')!;
    foreignLink = bpf.linkCreateCgroup(prog.fd, cgroup, bpf.consts.attachType.CGROUP_INET4_CONNECT!);
    foreignProg = bpf.progInfo(prog.fd).id;

    writeFileSync(opts.pods, Array.from({ length: PODS }, (_, i) => stringify(istioPod({ name: `u${i}` }))).join('---\n'));
    agent = await AgentProcess.start(opts);
    if (mode === 'ebpf') {
      await execa('bpftool', ['map', 'create', foreignPin, 'type', 'hash', 'key', '4', 'value', '4', 'entries', '8', 'name', 'lb_backends']);
      await execa('bpftool', ['map', 'update', 'pinned', foreignPin, 'key', '1', '0', '0', '0', 'value', '10', '0', '0', '0']);
    }
    for (let i = 0; i < PODS; i++) {
      const ip = `198.18.${80 + i}.1`;
      const srv = `198.18.${80 + i}.2`;
      const { pod, app, server } = await podBesideServer(lab, `un${i}`, { a4: [`${ip}/24`], b4: [`${srv}/24`] }, [srv]);
      await server.listen(srv, 7, 'echo');
      // foreign chains in the pod's netns, before meshcap's
      for (const [t, chain] of [['nat', 'LB_NAT'], ['mangle', 'LB_MARK']] as const) {
        await execa('ip', ['netns', 'exec', pod.name, 'iptables', '-t', t, '-N', chain]);
        // pod 1's also uses conntrack, as a pod's own NAT rules would (see the stream figures)
        const ct = i === 1 ? ['-m', 'conntrack', '--ctstate', 'NEW'] : [];
        await execa('ip', ['netns', 'exec', pod.name, 'iptables', '-t', t, '-A', chain, '-d', '198.19.100.0/24', ...ct, '-j', 'RETURN']);
        await execa('ip', ['netns', 'exec', pod.name, 'iptables', '-t', t, '-A', 'OUTPUT', '-j', chain]);
      }
      const rules = await rulesOf(pod.name);
      const add = await cni('ADD', { socket: opts.socket, containerId: `c-u${i}`, netns: pod.path, pod: `u${i}`, podAddress: `${ip}/24` });
      expect(add.exitCode, add.stdout).toBe(0);
      pods.push({ name: `u${i}`, ip, srv, netns: pod, app, proxy: await lab.proxy(pod.name), rules });
    }
  }, scaled(180_000));

  afterAll(async () => {
    if (foreignLink !== null) bpf.closeFd(foreignLink); // not pinned: closing detaches it
    await endAgentRun({ agent, lab, pinRoot: opts.pinRoot, tmp });
    rmSync(foreignPin, { force: true });
    if (existsSync(opts.pinRoot)) rmdirSync(opts.pinRoot);
  });

  it('refused while pods are captured; --force --purge under load: in-flight connections counted, nothing of meshcap left, foreign state byte-equal', async () => {
    // meshcap's kernel objects, to look for afterwards
    const ours = { links: [] as number[], progs: [] as number[], maps: [] as number[] };
    if (mode === 'ebpf') {
      const walk = (d: string): string[] => readdirSync(d, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? walk(path.join(d, e.name)) : [path.join(d, e.name)]));
      for (const pin of walk(opts.pinRoot).filter((p) => p !== foreignPin)) {
        const fd = bpf.objGet(pin);
        try {
          if (pin.includes('/maps/')) ours.maps.push(bpf.mapInfo(fd).id);
          // the node's shared inbound program (progs/mc_inbound_main), not a link
          else if (pin.includes('/progs/')) ours.progs.push(bpf.progInfo(fd).id);
          else {
            const li = bpf.linkInfo(fd);
            ours.links.push(li.id);
            ours.progs.push(li.progId);
          }
        } finally {
          bpf.closeFd(fd);
        }
      }
      expect(ours.links.length).toBeGreaterThan(PODS);
    }
    const foreignDump = mode === 'ebpf' ? (await execa('bpftool', ['-j', 'map', 'dump', 'pinned', foreignPin])).stdout : '';

    // the operator deletes the DaemonSet: the agent stops, the capture stays in the kernel
    await agent!.stop();

    let stop = false;
    let phase: 'before' | 'during' | 'after' = 'before';
    const conns: { pod: number; phase: string; local: string; ok: boolean }[] = [];
    const traffic = pods.map(async (p, i) => {
      for (let n = 0; !stop && n < 20_000; n++) {
        const ph = phase;
        try {
          const r = await p.app.connect(p.srv, 80, `${i}-${n}`);
          conns.push({ pod: i, phase: ph === phase ? ph : 'during', local: r.local, ok: r.data === `${p.srv}:80|${i}-${n}` });
        } catch {
          conns.push({ pod: i, phase: ph === phase ? ph : 'during', local: '', ok: false });
        }
      }
    });
    // one long stream per pod, through its sidecar for the whole run
    const streamEnd = [0, 0];
    const streams = pods.map((p, i) => p.app.call<{ rounds: number; error?: string }>('pingPong', { host: p.srv, port: 7, rounds: ROUNDS, size: 100, timeoutMs: 120_000 })
      .catch((e: Error) => ({ rounds: -1, error: e.message }))
      .finally(() => { streamEnd[i] = performance.now(); }));
    await sleep(1000);

    const refused = await meshcap(['uninstall', '--pin-root', opts.pinRoot, '--state-dir', opts.stateDir]);
    expect(refused.exitCode).toBe(1);
    for (const p of pods) expect(refused.stderr).toContain(`default/${p.name}`);
    expect(refused.stderr).toMatch(/past the sidecar.*--force/s);
    await sleep(500);

    phase = 'during';
    const t0 = performance.now();
    const forced = await meshcap(['uninstall', '--pin-root', opts.pinRoot, '--state-dir', opts.stateDir, '--force', '--purge']);
    const uninstallMs = Math.round(performance.now() - t0);
    const t1 = performance.now();
    phase = 'after';
    await sleep(1500);
    stop = true;
    await Promise.all(traffic);
    const streamed = await Promise.all(streams);

    // through the sidecar: a proxy accept has the connection's local address as its peer
    const tally: Record<string, { total: number; failed: number; sidecar: number; direct: number }> = {};
    for (let i = 0; i < pods.length; i++) {
      const accepted = new Map<string, number>();
      // port 80 only: the stream's accept (port 7) would match a later connection that reuses its local port
      for (const a of pods[i]!.proxy.accepts()) if (a.listener !== 'inbound' && a.orig.endsWith(':80')) accepted.set(a.peer, (accepted.get(a.peer) ?? 0) + 1);
      for (const c of conns.filter((x) => x.pod === i)) {
        const t = (tally[c.phase] ??= { total: 0, failed: 0, sidecar: 0, direct: 0 });
        t.total++;
        if (!c.ok) t.failed++;
        else if ((accepted.get(c.local) ?? 0) > 0) {
          accepted.set(c.local, accepted.get(c.local)! - 1);
          t.sidecar++;
        } else t.direct++;
      }
    }
    const proxyErrors = pods.map((p) => p.proxy.lines.filter((l) => l.includes('"event":"error"')).length);
    const upstreamErrors = pods.map((p) => p.proxy.lines.filter((l) => l.includes('"event":"upstream-error"')));
    const fmt = (k: string) => { const t = tally[k] ?? { total: 0, failed: 0, sidecar: 0, direct: 0 }; return `${k}: ${t.total} (${t.sidecar} sidecar, ${t.direct} direct, ${t.failed} failed)`; };
    console.log(`[${mode}] uninstall --force --purge under load took ${uninstallMs} ms; connections ${fmt('before')}; ${fmt('during')}; ${fmt('after')}; ` +
      `long streams ${streamed.map((r, i) => `${r.rounds}/${ROUNDS} rounds${r.error ? ` (${r.error} ${Math.round(streamEnd[i]! - t0)} ms after the uninstall began)` : ''}`).join(', ')}; proxy SO_ORIGINAL_DST errors ${proxyErrors.join('+')}, upstream errors ${JSON.stringify(upstreamErrors)}; exit ${forced.exitCode}: ${forced.stdout.trim().replace(/\n/g, ' | ')} ${forced.stderr.trim().replace(/\n/g, ' | ')}`);

    expect(tally.before?.failed ?? 0).toBe(0);
    expect(tally.before?.direct ?? 0, 'before the uninstall every connection goes through the sidecar').toBe(0);
    expect(tally.after?.total ?? 0).toBeGreaterThan(10);
    expect(tally.after?.sidecar ?? 0, 'after it, none is captured').toBe(0);
    expect(tally.after?.failed ?? 0, 'and none fails: they go direct').toBe(0);
    // A stream established through the sidecar stays connected to it in eBPF
    // mode (the app's socket is the sidecar's peer: nothing to translate). In
    // iptables mode it lives on conntrack's REDIRECT binding: once meshcap's
    // rules are gone and nothing else in the netns uses conntrack, the kernel
    // stops tracking there, the app's next segment goes to the real server
    // untranslated and is answered with a reset. Pod 1 keeps a conntrack user.
    for (let i = 0; i < PODS; i++) {
      if (streamed[i]!.rounds === ROUNDS) expect(streamEnd[i]!, `pod ${i}'s whole stream was still open when the uninstall finished`).toBeGreaterThan(t1);
    }
    expect(streamed[1]!.rounds, 'pod 1: the stream through the sidecar goes on').toBe(ROUNDS);
    if (mode === 'ebpf') expect(streamed[0]!.rounds, 'pod 0: the stream through the sidecar goes on').toBe(ROUNDS);
    else expect(streamed[0]!.error, 'pod 0: conntrack gone with the rules, the stream is reset').toMatch(/ECONNRESET/);

    // nothing of meshcap left
    expect(existsSync(opts.stateDir), 'records purged').toBe(false);
    for (const p of pods) expect(await rulesOf(p.netns.name), `${p.name}: its netns's rules are the foreign ones only`).toBe(p.rules);
    const attached = JSON.stringify(await bpftoolJson<unknown>(['cgroup', 'show', cgroup]));
    for (const id of ours.progs) expect(attached).not.toMatch(new RegExp(`"id":${id}\\b`));
    const links = new Set((await bpftoolJson<{ id: number }[]>(['link', 'show'])).map((l) => l.id));
    for (const id of ours.links) expect(links.has(id), `link ${id}`).toBe(false);
    const maps = new Set((await bpftoolJson<{ id: number }[]>(['map', 'show'])).map((m) => m.id));
    for (const id of ours.maps) expect(maps.has(id), `map ${id}`).toBe(false);
    if (mode === 'ebpf') {
      expect(forced.exitCode, 'exit 1: a foreign pin was left under the pin root').toBe(1);
      expect(forced.stderr).toContain(`left in place (not meshcap's): ${foreignPin}`);
      expect(readdirSync(opts.pinRoot)).toEqual(['lb-backends']);
      expect((await execa('bpftool', ['-j', 'map', 'dump', 'pinned', foreignPin])).stdout, 'foreign pin byte-equal').toBe(foreignDump);
    } else {
      expect(forced.exitCode, forced.stderr).toBe(0);
      expect(existsSync(opts.pinRoot)).toBe(false);
    }
    // the foreign cgroup program is still attached, the same one
    expect(attached).toMatch(new RegExp(`"id":${foreignProg}\\b`));
  }, scaled(300_000));
});
