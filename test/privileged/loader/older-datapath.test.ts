// A datapath pinned by an older meshcap (before mc_portranges) under this
// version's CLI and agent code: status, DEL and uninstall must work on it
// (an upgrade's first minutes, or a rollback), and a pod that needs port
// ranges is refused with what to do, never half-written.
import { rmSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { loadDatapath, uninstallDatapath } from '../../../src/loader/datapath.js';
import { pinLayout } from '../../../src/loader/manifest.js';
import { MAP } from '../../../src/maps/layout.js';
import { projectRoot } from '../../../src/paths.js';
import { EbpfBackend } from '../../../src/pod-datapath/ebpf.js';
import { describeEbpf } from '../../helpers/datapaths.js';
import { Lab, scaled, testPinRoot } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

describeEbpf('a datapath pinned by an older meshcap (no mc_portranges)', () => {
  const lab = new Lab();
  const pinRoot = testPinRoot();
  let pod: { name: string; path: string };

  beforeAll(async () => {
    await loadDatapath({ pinRoot });
    rmSync(path.join(pinLayout(pinRoot).maps, MAP.portranges)); // as an older version pinned it
    pod = await lab.netns('old');
  }, scaled(60_000));

  afterAll(async () => {
    uninstallDatapath(pinRoot);
    await lab.cleanup();
  });

  it('pods without long port lists register, check and unregister; one with them is refused naming the fix', async () => {
    const be = new EbpfBackend(pinRoot);
    try {
      const cookie = await be.register({ netns: pod.path, config: istioCapture({ ips: ['198.18.28.1'], ipv6: false }), podIPs: ['198.18.28.1'] });
      expect(be.checkEntries(cookie, istioCapture({ ips: ['198.18.28.1'], ipv6: false }), ['198.18.28.1'])).toEqual([]);
      const wide = istioCapture({ ips: ['198.18.28.1'], ipv6: false, annotations: { 'traffic.sidecar.istio.io/excludeOutboundPorts': Array.from({ length: 64 }, (_, i) => String(3000 + i)).join(',') } });
      await expect(be.register({ netns: pod.path, config: wide, podIPs: ['198.18.28.1'] })).rejects.toThrow(/predates port ranges.*meshcap load/);
      expect(be.remove(cookie)).toBeGreaterThan(0);
      expect(be.leftovers(cookie)).toBe(0);
    } finally {
      be.close();
    }
  });

  it('meshcap status and meshcap uninstall work on it', async () => {
    const status = await execa(process.execPath, [path.join(projectRoot, 'bin/meshcap'), 'status', '--pin-root', pinRoot, '--state-dir', path.join(pinRoot, 'no-state'), '-o', 'json'], { reject: false });
    expect(status.stderr).not.toMatch(/cannot open/);
    const un = await execa(process.execPath, [path.join(projectRoot, 'bin/meshcap'), 'uninstall', '--force', '--pin-root', pinRoot], { reject: false });
    expect(un.exitCode, un.stderr).toBe(0);
    expect(un.stdout).toMatch(/detached \d+ links, removed \d+ pins/);
  });
});
