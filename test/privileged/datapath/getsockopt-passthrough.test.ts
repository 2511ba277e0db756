// meshcap's cgroup/getsockopt program runs for every getsockopt on the node
// (it sits at the cgroup v2 root). For every option but SO_ORIGINAL_DST it
// must be invisible, including answers longer than a page: iptables-legacy's
// IPT_SO_GET_ENTRIES (how kube-proxy reads its tables; 73 KB here) and
// SO_PEERGROUPS with 2,500 groups. Before upstream 29ebbba7d461 a program that
// returned without setting optlen to 0 turned those into EFAULT; kernels that
// carry the fix (this host, the matrix's 6.1/6.12) hide the difference, older
// 5.15 stables do not. Compared byte for byte (sha256) without meshcap, with
// the datapath loaded, and inside a meshed pod.
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { loadDatapath, uninstallDatapath } from '../../../src/loader/datapath.js';
import { EbpfBackend } from '../../../src/pod-datapath/ebpf.js';
import { describeEbpf } from '../../helpers/datapaths.js';
import { Lab, scaled, testPinRoot } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

const PROBE = fileURLToPath(new URL('./large_getsockopt.py', import.meta.url));

interface Answer { errno: number; len: number; sha256: string }
type Answers = { ipt_get_entries: Answer; ipt_entries_size?: number; so_peergroups: Answer; so_rcvbuf_8k: Answer };

describeEbpf('cgroup/getsockopt passes every other option through untouched, answers over a page included', () => {
  const lab = new Lab();
  const pinRoot = testPinRoot();
  let ebpf: EbpfBackend | undefined;
  let ns: { name: string; path: string };
  let pod: { name: string; path: string };
  let without: Answers;

  const probe = async (netns: string): Promise<Answers> => {
    const r = await execa('ip', ['netns', 'exec', netns, 'python3', PROBE]);
    return JSON.parse(r.stdout) as Answers;
  };

  /** 150 legacy filter rules with comments: IPT_SO_GET_ENTRIES answers ~73 KB. */
  const fillLegacyTable = async (netns: string) => {
    const restore = ['*filter'];
    for (let i = 1; i <= 150; i++) restore.push(`-A INPUT -s 198.18.${i >> 8}.${(i & 255) || 1}/32 -p tcp --dport ${1000 + i} -m comment --comment "meshcap test rule ${i} padding padding" -j ACCEPT`);
    restore.push('COMMIT', '');
    await execa('ip', ['netns', 'exec', netns, 'iptables-legacy-restore'], { input: restore.join('\n') });
  };

  beforeAll(async () => {
    ns = await lab.netns('gso');
    pod = await lab.netns('gsopod');
    await fillLegacyTable(ns.name);
    await fillLegacyTable(pod.name);
    without = await probe(ns.name);
    // The probe itself must see what it is meant to: answers over a page.
    expect(without.ipt_get_entries.errno).toBe(0);
    expect(without.ipt_get_entries.len).toBeGreaterThan(64 * 1024);
    expect(without.so_peergroups).toMatchObject({ errno: 0, len: 10_000 });
    await loadDatapath({ pinRoot });
    ebpf = new EbpfBackend(pinRoot);
    await ebpf.register({ netns: pod.path, config: istioCapture({ ips: ['198.18.30.1'] }), podIPs: ['198.18.30.1'] });
  }, scaled(120_000));

  afterAll(async () => {
    ebpf?.close();
    uninstallDatapath(pinRoot);
    await lab.cleanup();
  });

  it('outside meshed pods: IPT_SO_GET_ENTRIES (73 KB), SO_PEERGROUPS (10 KB) and an 8 KiB SO_RCVBUF are byte-identical', async () => {
    expect(await probe(ns.name)).toEqual(without);
  });

  it('side by side with a second datapath at the root, each one\'s SO_ORIGINAL_DST answer survives the other\'s pass-through', async () => {
    // Two getsockopt programs at the cgroup root run one after the other: the
    // later one must not throw away what the earlier one answered.
    const srv = await lab.netns('gsosrv');
    const app1 = await lab.netns('gsoa1');
    const app2 = await lab.netns('gsoa2');
    await lab.link(app1.name, srv.name, { a4: ['198.18.31.1/24'], b4: ['198.18.31.2/24'] });
    await lab.link(app2.name, srv.name, { a4: ['198.18.32.1/24'], b4: ['198.18.32.2/24'] });
    const server = await lab.agent(srv.name);
    await server.listen('198.18.31.2', 80);
    await server.listen('198.18.32.2', 80);
    const second = testPinRoot();
    await loadDatapath({ pinRoot: second });
    const other = new EbpfBackend(second);
    try {
      // app1 in the datapath attached first, app2 in the one attached second
      await ebpf!.register({ netns: app1.path, config: istioCapture({ ips: ['198.18.31.1'], ipv6: false }), podIPs: ['198.18.31.1'] });
      await other.register({ netns: app2.path, config: istioCapture({ ips: ['198.18.32.1'], ipv6: false }), podIPs: ['198.18.32.1'] });
      for (const [ns, dst] of [[app1, '198.18.31.2'], [app2, '198.18.32.2']] as const) {
        const proxy = await lab.proxy(ns.name);
        const app = await lab.agent(ns.name);
        expect((await app.connect(dst, 80, 'both')).data).toBe(`${dst}:80|both`);
        expect(proxy.accepts().map((a) => a.orig)).toEqual([`${dst}:80`]);
      }
    } finally {
      other.close();
      uninstallDatapath(second);
    }
  });

  it('inside a meshed pod: the same answers', async () => {
    const inPod = await probe(pod.name);
    // The pod netns has the same 150 rules, so the same table bytes.
    expect(inPod).toEqual(without);
  });
});
