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
});
