// PodMaps against the pinned maps of a loaded datapath: a pod's entries
// follow its config (stale CIDR/port entries go, others' entries stay), and
// a fresh PodMaps (an agent restart) removes entries an earlier one wrote.
import { afterEach, beforeEach, expect, it } from 'vitest';
import { describeEbpf } from '../../helpers/datapaths.js';
import { existsSync } from 'node:fs';
import { loadDatapath, uninstallDatapath } from '../../../src/loader/datapath.js';
import { pinLayout } from '../../../src/loader/manifest.js';
import { PodMaps } from '../../../src/maps/registry.js';
import { testPinRoot } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

let root: string;
const open: PodMaps[] = [];
const maps = () => {
  const m = new PodMaps(pinLayout(root).maps);
  open.push(m);
  return m;
};

const cfg = (annotations: Record<string, string>) => istioCapture({ annotations });
const A = 0x1111n;
const B = 0x2222n;
const IP = ['198.18.0.10'];

describeEbpf('PodMaps', () => {
  beforeEach(async () => {
    root = testPinRoot();
    await loadDatapath({ pinRoot: root });
  });
  afterEach(() => {
    for (const m of open.splice(0)) m.close();
    if (existsSync(root)) uninstallDatapath(root);
  });

  it('a re-written pod keeps exactly its new entries and leaves other pods alone', () => {
    const m = maps();
    const wide = cfg({ 'traffic.sidecar.istio.io/excludeOutboundPorts': '1,2,3,4', 'traffic.sidecar.istio.io/excludeOutboundIPRanges': '198.19.0.0/16,198.19.1.0/24' });
    const narrow = cfg({ 'traffic.sidecar.istio.io/excludeOutboundPorts': '2' });
    m.write(A, wide, IP);
    m.write(B, wide, IP);
    const bCidrs = m.keysOf('mc_cidrs', B).length;
    const bPorts = m.keysOf('mc_ports', B).length;
    expect(m.diff(A, wide, IP)).toEqual([]);

    m.write(A, narrow, IP);
    expect(m.diff(A, narrow, IP)).toEqual([]); // diff reads the kernel: no stale entry left
    expect(m.keysOf('mc_ports', A).length).toBeLessThan(bPorts);
    expect(m.keysOf('mc_cidrs', B).length).toBe(bCidrs);
    expect(m.keysOf('mc_ports', B).length).toBe(bPorts);
    expect(m.diff(B, wide, IP)).toEqual([]);
  });

  it('a new instance (agent restart) finds and removes what an earlier one wrote', () => {
    const wide = cfg({ 'traffic.sidecar.istio.io/excludeOutboundPorts': '1,2,3', 'traffic.sidecar.istio.io/excludeOutboundIPRanges': '198.19.0.0/16' });
    maps().write(A, wide, IP);
    maps().write(B, wide, IP);
    const later = maps();
    expect(later.remove(A)).toBeGreaterThan(3);
    expect(later.pod(A)).toBeNull();
    expect(later.keysOf('mc_cidrs', A)).toEqual([]);
    expect(later.keysOf('mc_ports', A)).toEqual([]);
    expect(later.diff(B, wide, IP)).toEqual([]);
    // and a re-config by the new instance drops the old instance's extra keys
    later.write(B, cfg({}), IP);
    expect(later.diff(B, cfg({}), IP)).toEqual([]);
  });

  it('a snapshot read by batch lookup and one read by the key walk are the same, and diff against either finds what the kernel shows', () => {
    const m = maps();
    const ANNOTATIONS_RANGED = { 'traffic.sidecar.istio.io/excludeOutboundPorts': '1,2,3,4', 'traffic.sidecar.istio.io/excludeInboundPorts': Array.from({ length: 20 }, (_, i) => 20000 + i).join(','), 'traffic.sidecar.istio.io/excludeOutboundIPRanges': '198.19.0.0/16' };
    const ranged = cfg(ANNOTATIONS_RANGED);
    const plain = cfg({});
    m.write(A, ranged, IP);
    m.write(B, plain, ['198.18.0.11']);
    const dump = (s: ReturnType<PodMaps['snapshot']>) => JSON.stringify({
      keys: [...s.keys].map(([map, byPod]) => [map, [...byPod].map(([n, k]) => [String(n), [...k].sort()]).sort()]),
      pods: [...s.pods].map(([n, v]) => [String(n), v.toString('hex')]).sort(),
      stats: [...s.stats].map(([n, v]) => [String(n), v.toString('hex')]).sort(),
      ranges: [...s.ranges].map(([k, v]) => [k, v.toString('hex')]).sort(),
    });
    for (const noBatch of [false, true]) {
      const snap = m.snapshot({ noBatch });
      expect(dump(snap)).toBe(dump(m.snapshot({ noBatch: !noBatch })));
      expect(snap.pods.size).toBe(2);
      expect(snap.ranges.size).toBeGreaterThan(0);
      expect(m.diff(A, ranged, IP, snap)).toEqual([]);
      expect(m.diff(B, plain, ['198.18.0.11'], snap)).toEqual([]);
      // the snapshot's view of a wrong config or address is the kernel's
      expect(m.diff(A, plain, IP, snap)).toEqual(m.diff(A, plain, IP));
      expect(m.diff(A, plain, IP, snap).join('; ')).toMatch(/mc_pods entry for netns cookie .* differs.*stale mc_ports entries.*stale mc_portranges entries/);
      expect(m.diff(B, plain, ['198.18.0.12'], snap)).toEqual([`mc_pods entry for netns cookie ${B} differs from the pod's config`]);
      // the same range key (kind, index) with other bounds: only its value tells
      const wider = cfg({ ...ANNOTATIONS_RANGED, 'traffic.sidecar.istio.io/excludeInboundPorts': Array.from({ length: 22 }, (_, i) => 20000 + i).join(',') });
      expect(m.diff(A, wider, IP, snap)).toEqual(['1 mc_portranges entries with other bounds']);
      expect(m.diff(A, wider, IP)).toEqual(['1 mc_portranges entries with other bounds']);
    }
    // a pod gone from the maps after the snapshot: 'values' re-reads its mc_pods/mc_stats
    const snap = m.snapshot();
    m.remove(B);
    expect(m.diff(B, plain, ['198.18.0.11'], snap)).toEqual([]);
    m.refreshSnapshot(snap, B, 'values');
    expect(m.diff(B, plain, ['198.18.0.11'], snap)).toEqual([`no mc_pods entry for netns cookie ${B}`, 'no mc_stats entry']);
    expect(m.diff(B, plain, ['198.18.0.11'])).toEqual(expect.arrayContaining([`no mc_pods entry for netns cookie ${B}`, 'no mc_stats entry']));
  });
});
