// Bounded maps (issue 15, part 7; figures in docs/reliability.md): what the
// CNI ADD that does not fit answers. The node-wide maps are filled up to one
// slot short through the real PodMaps API (a write per pod, as the agent
// does, but from the test: 16,383 CNI ADDs through the forwarder would take
// an hour on this machine), then the last pods come through the real
// `meshcap-cni` binary and `meshcap agent`:
//  - mc_pods/mc_stats (16,384 pods): the 16,384th real ADD is captured, the
//    16,385th is refused with a CNI error naming the pod, the map, its
//    capacity and what to do; nothing of it is written (no entry, link,
//    record), meshcap_bpf_map_full_total counts it; after one pod leaves, the
//    runtime's retry of the same ADD is captured;
//  - mc_cidrs (LPM trie, 65,536 CIDRs): a pod needing 3 CIDRs with 2 free is
//    refused the same way, and the 2 it did insert are taken out again.
// Never a success without capture, never a half-written pod.
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { stringify } from 'yaml';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { readRecords } from '../../src/agent/state-store.js';
import { pinLayout } from '../../src/loader/manifest.js';
import { MAP } from '../../src/maps/layout.js';
import { podEntries } from '../../src/maps/pod-entries.js';
import { PodMaps } from '../../src/maps/registry.js';
import * as bpf from '../../src/native/addon.js';
import { netnsCookie } from '../../src/pod-netns.js';
import { AgentProcess, endAgentRun } from '../helpers/agent-process.js';
import { describeEbpf } from '../helpers/datapaths.js';
import { Lab, scaled, testPinRoot } from '../helpers/lab.js';
import { istioCapture, istioPod } from '../helpers/pods.js';
import { cni, requireCniBinary, type CniCall } from '../privileged/agent/cni-harness.js';

/** Cookies no real netns has (the kernel counts from 1): the test's filler pods. */
const FAKE = 1n << 62n;
// Fillers capture no inbound ports: one mc_ports entry each, so with 16,384
// of them mc_ports (65,536) is not what fills first (a default Istio pod has
// 4 port entries: 16,384 x 4 = 65,536, exactly the port table).
const FILLER = istioCapture({ annotations: { 'traffic.sidecar.istio.io/includeInboundPorts': '' }, ipv6: false });
const CIDR_POD = ['198.18.200.0/24', '198.18.201.0/24', '198.18.202.0/24'];

function mapCount(dir: string, name: string): { entries: number; max: number } {
  const fd = bpf.objGet(path.join(dir, name));
  try {
    const info = bpf.mapInfo(fd);
    return { entries: bpf.mapKeys(fd, info.keySize).length, max: info.maxEntries };
  } finally {
    bpf.closeFd(fd);
  }
}

async function metric(addr: string, name: string, labels: string): Promise<number | null> {
  const text = await (await fetch(`http://${addr}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name}{${labels}}`) || (labels === '' && l.startsWith(`${name} `)));
  return line ? Number(line.slice(line.lastIndexOf(' ') + 1)) : null;
}

describeEbpf('bounded eBPF maps: the ADD that does not fit is refused, named and counted', () => {
  const lab = new Lab();
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-bounded-'));
  const metricsAddr = `127.0.0.1:${20000 + Math.floor(Math.random() * 20000)}`;
  const opts = {
    pods: path.join(tmp, 'pods.yaml'), socket: path.join(tmp, 'cni.sock'), pinRoot: testPinRoot(), stateDir: path.join(tmp, 'state'),
    mode: 'ebpf' as const, extraArgs: ['--metrics-addr', metricsAddr],
  };
  const mapsDir = pinLayout(opts.pinRoot).maps;
  let agent: AgentProcess | undefined;
  let maps: PodMaps | undefined;

  const call = async (pod: string, i: number): Promise<CniCall> => {
    const ns = await lab.netns(`bm${i}`);
    return { socket: opts.socket, containerId: `c-${pod}`, netns: ns.path, pod, podAddress: `198.18.90.${i}/24` };
  };

  beforeAll(async () => {
    requireCniBinary();
    writeFileSync(opts.pods, [
      istioPod({ name: 'last' }), istioPod({ name: 'over' }),
      istioPod({ name: 'cidr-over', annotations: { 'traffic.sidecar.istio.io/excludeOutboundIPRanges': CIDR_POD.join(',') } }),
    ].map((p) => stringify(p)).join('---\n'));
    agent = await AgentProcess.start(opts);
    maps = new PodMaps(mapsDir);
  }, scaled(120_000));

  afterAll(async () => {
    maps?.close();
    await endAgentRun({ agent, lab, pinRoot: opts.pinRoot, tmp });
  });

  it('mc_pods: the 16,384th pod is captured, the 16,385th ADD is refused naming the pod, the map, its capacity and what to do', async () => {
    const max = mapCount(mapsDir, MAP.pods).max;
    expect(max, 'MC_MAX_PODS').toBe(16384);
    const t0 = performance.now();
    const fillers = max - 1 - maps!.pods().length;
    for (let i = 0; i < fillers; i++) maps!.write(FAKE + BigInt(i), FILLER, ['198.18.91.1']);
    const fillMs = Math.round(performance.now() - t0);
    expect(mapCount(mapsDir, MAP.pods).entries).toBe(max - 1);

    const last = await call('last', 1);
    const ok = await cni('ADD', last);
    expect(ok.exitCode, ok.stdout).toBe(0);
    expect(mapCount(mapsDir, MAP.pods).entries).toBe(max);

    const over = await call('over', 2);
    const cookie = await netnsCookie(over.netns!);
    const portsBefore = mapCount(mapsDir, MAP.ports).entries;
    const refused = await cni('ADD', over);
    const msg = String(refused.json?.msg ?? '');
    console.log(`[ebpf] ${MAP.pods} max_entries ${max}: ${fillers} filler pods written in ${fillMs} ms, the ${max}th pod's real ADD exit ${ok.exitCode}, ` +
      `the ${max + 1}th: exit ${refused.exitCode} code ${String(refused.json?.code)} in ${Math.round(refused.ms)} ms: ${msg}`);
    expect(refused.exitCode, 'never a success without capture').toBe(1);
    expect(refused.json?.code).toBe(100);
    for (const want of ['default/over', 'is full', String(max), 'iptables', 'drain']) expect(msg, want).toContain(want);
    expect(msg).toMatch(/mc_(pods|stats)/);
    // nothing of the refused pod written
    expect(maps!.pod(cookie)).toBeNull();
    expect(maps!.stats(cookie)).toBeNull();
    expect(maps!.keysOf(MAP.ports, cookie)).toEqual([]);
    expect(mapCount(mapsDir, MAP.ports).entries).toBe(portsBefore);
    expect(existsSync(pinLayout(opts.pinRoot).podDir(cookie)), 'no inbound link pinned').toBe(false);
    expect(readRecords(opts.stateDir).records.map((r) => r.podName)).toEqual(['last']);
    expect(agent!.logs.some((l) => l.msg === 'pod refused: an eBPF map is full' && l.pod === 'default/over')).toBe(true);
    // the metrics show it
    const full = (await metric(metricsAddr, 'meshcap_bpf_map_full_total', `map="${MAP.stats}"`)) ?? (await metric(metricsAddr, 'meshcap_bpf_map_full_total', `map="${MAP.pods}"`));
    expect(full).toBe(1);
    expect(await metric(metricsAddr, 'meshcap_bpf_map_entries', `map="${MAP.pods}"`)).toBe(max);
    expect(await metric(metricsAddr, 'meshcap_bpf_map_max_entries', `map="${MAP.pods}"`)).toBe(max);
    expect(await metric(metricsAddr, 'meshcap_cni_requests_total', 'verb="ADD",result="error_100"')).toBe(1);

    // one pod leaves: the runtime's retry of the same ADD is captured
    maps!.remove(FAKE);
    const retry = await cni('ADD', over);
    expect(retry.exitCode, retry.stdout).toBe(0);
    expect((await cni('CHECK', over)).exitCode).toBe(0);
    for (let i = 1; i < fillers; i++) maps!.remove(FAKE + BigInt(i));
    for (const c of [last, over]) expect((await cni('DEL', c)).exitCode).toBe(0);
    expect(mapCount(mapsDir, MAP.pods).entries).toBe(0);
  }, scaled(300_000));

  it('mc_cidrs: a pod needing 3 CIDRs with 2 free is refused naming the map and its capacity; the 2 it inserted are taken out again', async () => {
    const { max } = mapCount(mapsDir, MAP.cidrs);
    expect(max, 'MC_MAX_CIDRS').toBe(65536);
    const per = 1000;
    const list = Array.from({ length: per }, (_, i) => `198.18.${100 + (i >> 8)}.${i & 255}/32`);
    const t0 = performance.now();
    let n = mapCount(mapsDir, MAP.cidrs).entries;
    let pods = 0;
    while (n < max - 2) {
      const take = Math.min(per, max - 2 - n);
      const cfg = istioCapture({ annotations: { 'traffic.sidecar.istio.io/excludeOutboundIPRanges': list.slice(0, take).join(','), 'traffic.sidecar.istio.io/includeInboundPorts': '' }, ipv6: false });
      expect(podEntries(FAKE, cfg, ['198.18.91.1']).cidrs.length).toBe(take);
      maps!.write(FAKE + BigInt(pods++), cfg, ['198.18.91.1']);
      n += take;
    }
    const fillMs = Math.round(performance.now() - t0);
    expect(mapCount(mapsDir, MAP.cidrs).entries).toBe(max - 2);

    const over = await call('cidr-over', 3);
    const cookie = await netnsCookie(over.netns!);
    const refused = await cni('ADD', over);
    const msg = String(refused.json?.msg ?? '');
    console.log(`[ebpf] ${MAP.cidrs} max_entries ${max}: ${max - 2} CIDRs of ${pods} filler pods written in ${fillMs} ms; a pod needing ${CIDR_POD.length}: ` +
      `exit ${refused.exitCode} code ${String(refused.json?.code)} in ${Math.round(refused.ms)} ms: ${msg}`);
    expect(refused.exitCode).toBe(1);
    expect(refused.json?.code).toBe(100);
    for (const want of ['default/cidr-over', `${MAP.cidrs} is full`, 'ENOSPC', String(max), 'needs 3 more', 'shorten']) expect(msg, want).toContain(want);
    expect(mapCount(mapsDir, MAP.cidrs).entries, 'the 2 CIDRs it inserted are undone').toBe(max - 2);
    expect(maps!.keysOf(MAP.cidrs, cookie)).toEqual([]);
    expect(maps!.pod(cookie)).toBeNull();
    expect(await metric(metricsAddr, 'meshcap_bpf_map_full_total', `map="${MAP.cidrs}"`)).toBe(1);
    for (let i = 0; i < pods; i++) maps!.remove(FAKE + BigInt(i));
    const retry = await cni('ADD', over);
    expect(retry.exitCode, retry.stdout).toBe(0);
    expect(maps!.keysOf(MAP.cidrs, cookie)).toHaveLength(3);
    expect((await cni('DEL', over)).exitCode).toBe(0);
  }, scaled(300_000));
});
