// The in-flight LRU maps under a connection storm (issue 15, part 7; figures
// in docs/reliability.md). Since destination slots (docs/datapath.md), a
// connection to a sidecar on 0.0.0.0 (Envoy's way) carries nothing: its
// address names its destination, which the first storm checks; the LRU
// path is what a connection without a slot takes (a sidecar bound to
// 127.0.0.1, as linkerd2-proxy is; IPv6), which the sidecars of the other
// cases are. A connect redirected that way to the sidecar carries its
// original destination through two LRU maps (mc_sockorig: socket cookie,
// connect -> TCP_CONNECT_CB; mc_origdst: tuple, -> the proxy's
// PASSIVE_ESTABLISHED_CB; sized at load, docs/datapath.md "Map sizes and
// memory"), and then in the accepted
// socket's own storage. LRU maps never refuse an insert: when full they
// evict. One meshed pod, the app and a C sidecar (test/faults/fixtures/
// mc-storm.c, as uid 1337) that checks every accepted connection's
// SO_ORIGINAL_DST against the address the app dialled:
//  1. a 5 s storm, as many connects/s as this machine makes (2 threads);
//  2. the same with both maps first filled to max_entries with stale
//     entries (what connections that never completed leave behind);
//  3. entries lost in flight (what an eviction does), made deterministic:
//     the SYNs to the sidecar dropped for a moment (an iptables rule in the
//     test's pod netns) so handshakes wait with their entry in mc_origdst,
//     the entries deleted, the rule removed.
// Required: no connection is given a wrong original destination; a lost
// one fails at the proxy (SO_ORIGINAL_DST answers ENOENT, as conntrack
// would for a connection it does not know) and is reset, and the metrics show it: meshcap_redirected_connections_total
// {direction="outbound"} grows by that many more than
// meshcap_original_dst_answered_total.
import { chmodSync, mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { stringify } from 'yaml';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { pinLayout } from '../../src/loader/manifest.js';
import { MAP, mcOrig, mcTuple } from '../../src/maps/layout.js';
import * as bpf from '../../src/native/addon.js';
import { netnsCookie } from '../../src/pod-netns.js';
import { projectRoot } from '../../src/paths.js';
import { AgentProcess, endAgentRun } from '../helpers/agent-process.js';
import { podBesideServer } from '../helpers/agent-fixture.js';
import { describeEbpf } from '../helpers/datapaths.js';
import { Lab, scaled, testPinRoot, type NsAgent } from '../helpers/lab.js';
import { istioPod } from '../helpers/pods.js';
import { cni, requireCniBinary } from '../privileged/agent/cni-harness.js';

const POD_IP = '198.18.95.1';
const SRV = '198.18.95.2';
const SECONDS = 5;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface StormResult { connections: number; ok: number; misrouted: number; reset: number; connectErrors: number; firstErrno: string; perSecond: number }
interface SidecarStats { accepted: number; origdstOk: number; misrouted: number; origdstFailed: number; failErrno: string }

async function metric(addr: string, line: string): Promise<number> {
  const text = await (await fetch(`http://${addr}/metrics`)).text();
  const l = text.split('\n').find((x) => x.startsWith(`${line} `));
  if (!l) throw new Error(`no ${line} in the agent's /metrics`);
  return Number(l.slice(l.lastIndexOf(' ') + 1));
}

function withMap<T>(pinRoot: string, name: string, fn: (fd: number, info: bpf.KernelMapInfo) => T): T {
  const fd = bpf.objGet(path.join(pinLayout(pinRoot).maps, name));
  try {
    return fn(fd, bpf.mapInfo(fd));
  } finally {
    bpf.closeFd(fd);
  }
}

describeEbpf('the in-flight LRU maps under a connection storm through one pod', () => {
  const lab = new Lab();
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-storm-'));
  const metricsAddr = `127.0.0.1:${20000 + Math.floor(Math.random() * 20000)}`;
  const opts = {
    pods: path.join(tmp, 'pods.yaml'), socket: path.join(tmp, 'cni.sock'), pinRoot: testPinRoot(), stateDir: path.join(tmp, 'state'),
    mode: 'ebpf' as const, extraArgs: ['--metrics-addr', metricsAddr],
  };
  const bin = path.join(tmp, 'mc-storm');
  let agent: AgentProcess | undefined;
  let pod: { name: string; path: string };
  let app: NsAgent;
  let cookie: bigint;

  const sidecar = async (args: string[] = []) => {
    const s = lab.spawn(pod.name, [bin, 'sidecar', '--port', '15001', '--expect', `${SRV}:80`, ...args], { uid: 1337, until: /"ready"/ });
    await s.ready;
    return {
      pid: s.proc.pid!,
      async stop(): Promise<SidecarStats> {
        s.proc.kill('SIGTERM');
        await s.proc;
        const line = s.lines.find((l) => l.includes('"stats"'));
        if (!line) throw new Error(`mc-storm sidecar printed no stats: ${s.stderr()}`);
        return JSON.parse(line) as SidecarStats;
      },
    };
  };
  const storm = async (): Promise<StormResult> => {
    const r = await execa('ip', ['netns', 'exec', pod.name, bin, 'client', '--host', SRV, '--port', '80', '--seconds', String(SECONDS), '--threads', '2']);
    return JSON.parse(r.stdout) as StormResult;
  };
  const counters = async () => ({
    redirected: await metric(metricsAddr, 'meshcap_redirected_connections_total{direction="outbound"}'),
    answered: await metric(metricsAddr, 'meshcap_original_dst_answered_total'),
  });
  const entries = (name: string) => withMap(opts.pinRoot, name, (fd, info) => bpf.mapKeys(fd, info.keySize));

  beforeAll(async () => {
    requireCniBinary();
    chmodSync(tmp, 0o755); // the sidecar runs as uid 1337
    await execa('cc', ['-O2', '-Wall', '-pthread', '-o', bin, path.join(projectRoot, 'test/faults/fixtures/mc-storm.c')]);
    writeFileSync(opts.pods, stringify(istioPod({ name: 'storm' })));
    agent = await AgentProcess.start(opts);
    ({ pod, app } = await podBesideServer(lab, 'storm', { a4: [`${POD_IP}/24`], b4: [`${SRV}/24`] }, []));
    const add = await cni('ADD', { socket: opts.socket, containerId: 'c-storm', netns: pod.path, pod: 'storm', podAddress: `${POD_IP}/24` });
    expect(add.exitCode, add.stdout).toBe(0);
    cookie = await netnsCookie(pod.path);
  }, scaled(120_000));

  afterAll(() => endAgentRun({ agent, lab, pinRoot: opts.pinRoot, tmp }));

  for (const [bind, carrier] of [['0.0.0.0', 'slots'], ['127.0.0.1', 'in-flight LRU']] as const) {
    it(`a ${SECONDS} s storm, sidecar on ${bind} (${carrier}): every connection reaches the sidecar with its own original destination`, async () => {
      const sc = await sidecar(['--bind', bind]);
      const podSlots = () => entries(MAP.dstslot).filter((k) => k.readBigUInt64LE(0) === cookie).length;
      const slotsBefore = podSlots();
      const before = await counters();
      const r = await storm();
      const s = await sc.stop();
      const after = await counters();
      const slots = podSlots();
      console.log(`[ebpf] storm ${SECONDS} s, 2 threads, sidecar on ${bind}, empty LRU: ${r.connections} connections (${r.perSecond}/s), ${r.ok} ok, ${r.misrouted} misrouted, ${r.reset} reset, ` +
        `${r.connectErrors} connect errors ${r.firstErrno}; sidecar: ${JSON.stringify(s)}; redirected +${after.redirected - before.redirected}, answered +${after.answered - before.answered}; ` +
        `left in ${MAP.origdst}: ${entries(MAP.origdst).length}, ${MAP.sockorig}: ${entries(MAP.sockorig).length}; the pod's slots: ${slots}`);
      expect(r.connections).toBeGreaterThan(1000);
      expect(r.misrouted + s.misrouted).toBe(0);
      expect(r.reset + r.connectErrors + s.origdstFailed).toBe(0);
      expect(r.ok).toBe(r.connections);
      expect(after.redirected - before.redirected - (after.answered - before.answered)).toBe(0);
      if (bind === '0.0.0.0') {
        // one destination: one slot, used by every connection; nothing carried in flight
        expect(slots).toBe(1);
        expect(entries(MAP.origdst).length).toBe(0);
      } else {
        expect(slots, 'a sidecar on 127.0.0.1 only gets no slots').toBe(slotsBefore);
      }
    }, scaled(120_000));
  }

  it('the same storm with both LRU maps full of stale entries: the stale ones are evicted, not the live ones', async () => {
    // stale: the tuples and cookies of a netns that is not there
    const stale = mcOrig.encode({ addr: Buffer.alloc(16, 0xee), port: 9, family: 4, kind: 1, netns: 1n << 62n });
    for (const [name, keyOf] of [
      [MAP.origdst, (i: number) => mcTuple.encode({ netns: 1n << 62n, laddr: Buffer.alloc(16, i >> 16), raddr: Buffer.alloc(16, (i >> 8) & 255), lport: i & 65535, rport: 1 })],
      [MAP.sockorig, (i: number) => { const b = Buffer.alloc(8); b.writeBigUInt64LE((1n << 62n) + BigInt(i)); return b; }],
    ] as const) {
      withMap(opts.pinRoot, name, (fd, info) => {
        for (let i = 0; i < info.maxEntries; i += 16384) {
          const keys = Array.from({ length: Math.min(16384, info.maxEntries - i) }, (_, j) => keyOf(i + j));
          bpf.mapUpdateBatch(fd, keys, keys.map(() => stale));
        }
      });
    }
    const full = { origdst: entries(MAP.origdst).length, sockorig: entries(MAP.sockorig).length };
    const sc = await sidecar(['--bind', '127.0.0.1']);
    const before = await counters();
    const r = await storm();
    const s = await sc.stop();
    const after = await counters();
    const left = entries(MAP.origdst).length;
    console.log(`[ebpf] storm ${SECONDS} s with ${MAP.origdst} ${full.origdst} and ${MAP.sockorig} ${full.sockorig} stale entries (max_entries ${withMap(opts.pinRoot, MAP.origdst, (_fd, i) => i.maxEntries)}): ` +
      `${r.connections} connections (${r.perSecond}/s), ${r.ok} ok, ${r.misrouted} misrouted, ${r.reset} reset, ${r.connectErrors} connect errors; sidecar: ${JSON.stringify(s)}; ` +
      `redirected +${after.redirected - before.redirected}, answered +${after.answered - before.answered}; ${MAP.origdst} entries after: ${left}`);
    // "full": the kernel's LRU keeps per-CPU free lists, so a batch fill stops a little short of max_entries
    const max = (name: string) => withMap(opts.pinRoot, name, (_fd, i) => i.maxEntries);
    expect(full.origdst, 'filled').toBeGreaterThan(0.95 * max(MAP.origdst));
    expect(full.sockorig, 'filled').toBeGreaterThan(0.95 * max(MAP.sockorig));
    expect(r.misrouted + s.misrouted).toBe(0);
    expect(r.reset + r.connectErrors + s.origdstFailed).toBe(0);
    expect(after.redirected - before.redirected - (after.answered - before.answered)).toBe(0);
    for (const name of [MAP.origdst, MAP.sockorig]) {
      withMap(opts.pinRoot, name, (fd, info) => bpf.mapDeleteBatch(fd, bpf.mapKeys(fd, info.keySize)));
    }
  }, scaled(300_000));

  it('original destinations lost in flight (as an eviction loses them): each such connection fails at the proxy, none is misrouted, the metrics show how many', async () => {
    const N = 40;
    // on 127.0.0.1: the connections without a slot, the ones that carry their destination in flight
    const sc = await sidecar(['--bind', '127.0.0.1']);
    // the SYNs to the sidecar dropped for a moment: every handshake waits
    // (SYN retransmitted after 1 s) with its entry in mc_origdst
    const drop = ['INPUT', '-p', 'tcp', '--dport', '15001', '-j', 'DROP'];
    await execa('ip', ['netns', 'exec', pod.name, 'iptables', '-I', ...drop]);
    const before = await counters();
    const conns = Array.from({ length: N }, (_, i) => app.call<{ data: string }>('connect', { host: SRV, port: 80, payload: '', timeoutMs: 30_000 }).then((r) => ({ i, data: r.data, error: '' }), (e: Error) => ({ i, data: '', error: e.message })));
    await sleep(400);
    let lost = 0;
    try {
      withMap(opts.pinRoot, MAP.origdst, (fd, info) => {
        // every second one: those keep their destination, the others lose it
        bpf.mapKeys(fd, info.keySize).filter((k) => k.readBigUInt64LE(0) === cookie).forEach((k, i) => {
          if (i % 2 === 0 && bpf.mapDelete(fd, k)) lost++;
        });
      });
    } finally {
      await execa('ip', ['netns', 'exec', pod.name, 'iptables', '-D', ...drop]);
    }
    const results = await Promise.all(conns);
    await sleep(500);
    const s = await sc.stop();
    const after = await counters();
    const ok = results.filter((r) => r.data === 'k').length;
    const misrouted = results.filter((r) => r.data === 'm').length;
    const failed = results.filter((r) => r.data !== 'k' && r.data !== 'm');
    const unanswered = after.redirected - before.redirected - (after.answered - before.answered);
    console.log(`[ebpf] ${N} connects held before the sidecar (SYNs dropped 0.4 s), ${lost} in-flight ${MAP.origdst} entries removed: ${ok} ok, ${misrouted} misrouted, ${failed.length} failed ` +
      `(${[...new Set(failed.map((f) => f.error || `data '${f.data}'`))].join(', ')}); sidecar: ${JSON.stringify(s)}; metrics: redirected +${after.redirected - before.redirected}, ` +
      `answered +${after.answered - before.answered}, unanswered ${unanswered}`);
    expect(lost, 'half the handshakes were waiting with their entry in the map').toBe(N / 2);
    expect(misrouted + s.misrouted, 'never a wrong original destination').toBe(0);
    expect(s.origdstFailed, 'each lost entry: SO_ORIGINAL_DST fails at the proxy').toBe(lost);
    expect(s.failErrno, 'ENOENT where the kernel has bpf_set_retval, else the kernel\'s own answer').toMatch(/^(ENOENT|ENOPROTOOPT)$/);
    expect(failed.length, 'and the app sees that connection fail').toBe(lost);
    expect(ok).toBe(N - lost);
    expect(unanswered, 'meshcap_redirected_connections_total - meshcap_original_dst_answered_total').toBe(lost);
  }, scaled(120_000));
});
