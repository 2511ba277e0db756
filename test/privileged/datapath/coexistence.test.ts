// Another program on connect4 at the cgroup root (issue 16, item 11): a
// socket-level service load balancer like Cilium's, rewriting the service
// 198.19.100.10:80 to the backend 198.18.25.2:80 (test/.../socklb.bpf.c).
// Cgroup programs run in attach order. Loaded after meshcap, the balancer
// sees the app's connect already sent to the sidecar, and the sidecar sees
// the service as its original destination, as Istio's iptables show it; the
// sidecar's own connect to the service is then balanced. Loaded before
// meshcap, it rewrites first and the sidecar sees the backend: meshcap's
// load reports that order with the program's name and what to do.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { cgroupPrograms, foreignBefore } from '../../../src/loader/cgroup-order.js';
import { loadDatapath, uninstallDatapath } from '../../../src/loader/datapath.js';
import { findCgroup2 } from '../../../src/loader/mounts.js';
import * as bpf from '../../../src/native/addon.js';
import { projectRoot } from '../../../src/paths.js';
import { EbpfBackend } from '../../../src/pod-datapath/ebpf.js';
import { describeEbpf } from '../../helpers/datapaths.js';
import { Lab, scaled, testPinRoot, type NsAgent } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

const SERVICE = '198.19.100.10';
const BACKEND = '198.18.25.2';
const POD = '198.18.25.1';

describeEbpf('another connect4 program at the cgroup root (a socket load balancer)', () => {
  const lab = new Lab();
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-coexist-'));
  const pins: string[] = [];
  let lbLink: number | null = null;
  let lbObj: bpf.BpfObject | null = null;
  let app: NsAgent;
  let pod: { name: string; path: string };
  let proxy: Awaited<ReturnType<Lab['proxy']>>;

  async function attachBalancer(): Promise<number> {
    const obj = path.join(tmp, 'socklb.bpf.o');
    await execa('clang', ['-target', 'bpf', '-O2', '-g', '-I', path.join(projectRoot, 'build'), '-idirafter', '/usr/include/x86_64-linux-gnu',
      '-c', path.join(projectRoot, 'test/privileged/datapath/fixtures/socklb.bpf.c'), '-o', obj]);
    lbObj = bpf.openObject(obj);
    await lbObj.load();
    const prog = lbObj.programs().find((p) => p.name === 'lb_connect4')!;
    lbLink = bpf.linkCreateCgroup(prog.fd, findCgroup2()!, bpf.consts.attachType.CGROUP_INET4_CONNECT!);
    return bpf.progInfo(prog.fd).id;
  }

  async function meshcapWithPod(): Promise<{ pinRoot: string; orderWarnings: string[]; ours: Set<number> }> {
    const pinRoot = testPinRoot();
    pins.push(pinRoot);
    const r = await loadDatapath({ pinRoot });
    const be = new EbpfBackend(pinRoot);
    try {
      await be.register({ netns: pod.path, config: istioCapture({ ips: [POD], ipv6: false }), podIPs: [POD] });
    } finally {
      be.close();
    }
    return { pinRoot, orderWarnings: r.orderWarnings, ours: new Set(r.links.map((l) => l.progId)) };
  }

  /** The original destination the sidecar accepted the app's connection to the service with. */
  async function sidecarSees(tag: string): Promise<string> {
    const before = proxy.accepts().length;
    const r = await app.connect(SERVICE, 80, tag);
    expect(r.data, 'reached the backend').toBe(`${BACKEND}:80|${tag}`);
    for (let i = 0; i < 40 && proxy.accepts().length === before; i++) await new Promise((res) => setTimeout(res, 25));
    const a = proxy.accepts().slice(before);
    expect(a.length, 'the sidecar accepted it').toBe(1);
    return a[0]!.orig;
  }

  beforeAll(async () => {
    pod = await lab.netns('lbpod');
    const srv = await lab.netns('lbsrv');
    await lab.link(pod.name, srv.name, { a4: [`${POD}/24`], b4: [`${BACKEND}/24`] });
    const server = await lab.agent(srv.name);
    await server.listen(BACKEND, 80);
    app = await lab.agent(pod.name);
    proxy = await lab.proxy(pod.name);
  }, scaled(120_000));

  afterAll(async () => {
    if (lbLink !== null) bpf.closeFd(lbLink); // an unpinned link: closing its last fd detaches it
    lbObj?.close();
    for (const p of pins) uninstallDatapath(p);
    await lab.cleanup();
    rmSync(tmp, { recursive: true, force: true });
  });

  it('meshcap first: the sidecar sees the service address, as with Istio\'s iptables; no warning', async () => {
    const m = await meshcapWithPod();
    expect(m.orderWarnings).toEqual([]);
    const lbId = await attachBalancer();
    const order = cgroupPrograms(findCgroup2()!).filter((p) => p.attachType === 'cgroup_inet4_connect').map((p) => p.id);
    expect(order.indexOf(lbId), 'attach order: the balancer after meshcap').toBeGreaterThan(order.findIndex((id) => m.ours.has(id)));
    expect(await sidecarSees('first')).toBe(`${SERVICE}:80`);
    uninstallDatapath(m.pinRoot);
  });

  it('the hook order comes from BPF_PROG_QUERY through the addon; a bad cgroup path is an error naming it and the errno', () => {
    expect(() => bpf.cgroupPrograms('/nonexistent-cgroup', bpf.consts.attachType.CGROUP_INET4_CONNECT!)).toThrow(/nonexistent-cgroup.*ENOENT|ENOENT.*nonexistent-cgroup/);
  });

  it('the balancer first: the sidecar sees the backend, and meshcap\'s load names the program that runs before it', async () => {
    const m = await meshcapWithPod();
    expect(m.orderWarnings).toHaveLength(1);
    expect(m.orderWarnings[0]).toMatch(/^cgroup_inet4_connect: lb_connect4 \(prog id \d+\) runs before meshcap's program/);
    expect(m.orderWarnings[0]).toMatch(/socketLB\.hostNamespaceOnly=true/);
    expect(foreignBefore(cgroupPrograms(findCgroup2()!), m.ours).map((f) => f.hook)).toEqual(['cgroup_inet4_connect']);
    expect(await sidecarSees('second')).toBe(`${BACKEND}:80`);
  });
});
