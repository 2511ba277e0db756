// `meshcap status` (collectStatus) over eBPF pods in every state it tells
// apart, in one pass as on a node: present; entries that differ from the
// record (the pinned link proves the netns live); the inbound link gone (not
// proven by a link: the netns is looked up, and the entries are compared with
// the link looked for); the netns deleted; map entries without a record
// (orphan).
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { collectStatus } from '../../../src/agent/status.js';
import { settingsOf, StateStore, STATE_VERSION } from '../../../src/agent/state-store.js';
import { loadDatapath, uninstallDatapath } from '../../../src/loader/datapath.js';
import { detachPodInbound } from '../../../src/pod-datapath/ebpf-inbound.js';
import { EbpfBackend } from '../../../src/pod-datapath/ebpf.js';
import { describeEbpf } from '../../helpers/datapaths.js';
import { Lab, scaled, testPinRoot } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

describeEbpf('meshcap status over eBPF pods in every state', () => {
  const lab = new Lab();
  const pinRoot = testPinRoot();
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-status-states-'));
  const stateDir = path.join(tmp, 'state');
  let be: EbpfBackend | undefined;
  const cookies = new Map<string, bigint>();

  beforeAll(async () => {
    await loadDatapath({ pinRoot });
    be = new EbpfBackend(pinRoot);
    const store = new StateStore(stateDir);
    store.open();
    for (const [i, name] of ['present', 'differs', 'unlinked', 'gone', 'orphan'].entries()) {
      const ns = await lab.netns(`st${name.slice(0, 4)}`);
      const ip = `198.18.60.${i + 1}`;
      const config = istioCapture({ ips: [ip], ipv6: false });
      const cookie = await be.register({ netns: ns.path, config, podIPs: [ip] });
      cookies.set(name, cookie);
      if (name === 'orphan') continue; // in the maps, no record
      // 'differs': the record asks for one more excluded outbound port than the maps hold
      const recorded = name === 'differs' ? istioCapture({ ips: [ip], ipv6: false, annotations: { 'traffic.sidecar.istio.io/excludeOutboundPorts': '5555' } }) : config;
      await store.put({
        version: STATE_VERSION, containerId: `c-${name}`, ifname: 'eth0', podNamespace: 'default', podName: name,
        netns: ns.path, netnsCookie: cookie.toString(), mode: 'ebpf', profile: 'istio',
        settings: settingsOf(recorded), podIPs: [ip], createdAt: new Date(0).toISOString(),
      });
      if (name === 'unlinked') expect(detachPodInbound(pinRoot, cookie)).toBe(true);
      if (name === 'gone') await execa('ip', ['netns', 'del', ns.name]);
    }
  }, scaled(120_000));

  afterAll(async () => {
    for (const c of cookies.values()) be?.remove(c);
    be?.close();
    uninstallDatapath(pinRoot);
    await lab.cleanup();
    rmSync(tmp, { recursive: true, force: true });
  });

  it('tells present, drift, a lost inbound link, a gone netns and an orphan apart', async () => {
    const r = await collectStatus({ stateDir, pinRoot });
    expect(r.problems).toEqual([]);
    const row = (name: string) => r.pods.find((p) => p.name === name)!;
    expect(row('present')).toMatchObject({ state: 'present', drift: [], mode: 'ebpf' });
    expect(row('present').connections).not.toBeNull();
    expect(row('differs').state).toBe('drift');
    expect(row('differs').drift).toContain('1 mc_ports entries missing');
    expect(row('differs').drift.join('; ')).not.toMatch(/inbound/);
    expect(row('unlinked')).toMatchObject({ state: 'drift', drift: ['no inbound sk_lookup link pinned'] });
    expect(row('gone')).toMatchObject({ state: 'netns-gone', drift: [] });
    const orphans = r.pods.filter((p) => p.state === 'orphan');
    expect(orphans.map((p) => p.netnsCookie)).toEqual([cookies.get('orphan')!.toString()]);
    expect(r.pods).toHaveLength(5);
  }, scaled(60_000));
});
