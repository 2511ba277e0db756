// SO_ORIGINAL_DST as conntrack answers it, in both modes with the same
// expectations (issue 16, item 10):
//  - a socket with no original destination (listening, unconnected; the
//    proxy's and the app's alike) gets conntrack's errno: ENOENT, EINVAL for a
//    buffer shorter than the struct, ENOPROTOOPT for UDP. eBPF mode answered
//    the proxy's listening and unconnected sockets with their own local
//    address before (the rule meant for sk_lookup-steered connections).
//  - IP6T_SO_ORIGINAL_DST's sockaddr_in6 byte for byte: sin6_flowinfo is the
//    proxy socket's flow label (here reflected from the app's leased label by
//    net.ipv6.flowlabel_reflect=1), sin6_scope_id 0 for a global address.
//    eBPF mode always answered flowinfo 0 before.
//  - the app's getpeername() of that socket: (address, port, flowinfo, scope id).
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { probeOptionalFeatures } from '../../../src/loader/probe.js';
import { describeModes, makeDriver, type Driver } from '../../helpers/datapaths.js';
import { Lab, scaled } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

const SCRIPT = fileURLToPath(new URL('./origdst_answers.py', import.meta.url));
const POD4 = '198.18.36.1';
const POD6 = '2001:db8:36::1';
const SRV4 = '198.18.36.2';
const SRV6 = '2001:db8:36::2';
const LABEL = 0x1234a;

/** What conntrack's getorigdst()/ipv6_getorigdst() answer for sockets with no entry. */
const NO_ENTRY = {
  tcp4_listening: { errno: 'ENOENT' },
  tcp4_listening_short_buffer: { errno: 'EINVAL' },
  tcp4_unconnected: { errno: 'ENOENT' },
  tcp6_listening: { errno: 'ENOENT' },
  udp4: { errno: 'ENOPROTOOPT' },
};

/** struct sockaddr_in6 as the kernel lays it out: family (host order), port, flowinfo (network order), addr, scope id. */
function sockaddrIn6(addr: string, port: number, flowinfo: number, scope: number): string {
  const b = Buffer.alloc(28);
  b.writeUInt16LE(10, 0);
  b.writeUInt16BE(port, 2);
  b.writeUInt32BE(flowinfo, 4);
  const groups = addr.split('::');
  const head = groups[0] ? groups[0].split(':') : [];
  const tail = groups[1] ? groups[1].split(':') : [];
  const words = [...head, ...Array<string>(8 - head.length - tail.length).fill('0'), ...tail];
  words.forEach((w, i) => b.writeUInt16BE(parseInt(w, 16), 8 + i * 2));
  b.writeUInt32LE(scope, 24);
  return b.toString('hex');
}

describeModes('SO_ORIGINAL_DST answers as conntrack gives them, %s mode', (mode) => {
  const lab = new Lab();
  let dp: Driver;
  let pod: { name: string; path: string };

  beforeAll(async () => {
    dp = await makeDriver(mode);
    pod = await lab.netns('odst');
    const srv = await lab.netns('odstsrv');
    await lab.link(pod.name, srv.name, { a4: [`${POD4}/24`], a6: [`${POD6}/64`], b4: [`${SRV4}/24`], b6: [`${SRV6}/64`] });
    await dp.register(pod.path, istioCapture({ ips: [POD4, POD6], ipv6: true }), [POD4, POD6]);
  }, scaled(60_000));

  afterAll(async () => {
    await lab.cleanup();
    await dp?.close();
  });

  it('a socket with no original destination gets conntrack\'s errno, for the proxy and for the app', async () => {
    // Without bpf_set_retval (before 5.18) the kernel's own answer stands:
    // conntrack's where nf_conntrack is loaded, ENOPROTOOPT for all where not
    // (documented); either way never an address.
    const conntrack = existsSync('/proc/sys/net/netfilter/nf_conntrack_max');
    const expected = mode === 'ebpf' && !probeOptionalFeatures().getsockoptRetval && !conntrack
      ? Object.fromEntries(Object.keys(NO_ENTRY).map((k) => [k, { errno: 'ENOPROTOOPT' }]))
      : NO_ENTRY;
    const proxy = JSON.parse((await lab.exec(pod.name, ['/usr/bin/python3', SCRIPT, 'errors', '15000'], { uid: 1337 })).stdout) as unknown;
    const app = JSON.parse((await lab.exec(pod.name, ['/usr/bin/python3', SCRIPT, 'errors', '8080'])).stdout) as unknown;
    expect(proxy, 'the proxy\'s sockets (uid 1337)').toEqual(expected);
    expect(app, 'the app\'s sockets').toEqual(expected);
  });

  it('IP6T_SO_ORIGINAL_DST is the full sockaddr_in6 conntrack gives (flow label, scope id), and the app\'s getpeername matches', async () => {
    // Where cgroup/getsockopt cannot call bpf_probe_read_kernel (lockdown,
    // or before 5.8) eBPF mode answers flowinfo 0 (documented).
    const flow = mode === 'ebpf' && !probeOptionalFeatures().getsockoptProbeRead ? 0 : LABEL;
    // Sockets created from here on reflect the flow label of the packets they receive.
    await lab.exec(pod.name, ['sysctl', '-qw', 'net.ipv6.flowlabel_reflect=1']);
    const proxy = lab.spawn(pod.name, ['/usr/bin/python3', SCRIPT, 'proxy'], { uid: 1337, until: /"ready"/ });
    await proxy.ready;
    const app = await lab.exec(pod.name, ['/usr/bin/python3', SCRIPT, 'app', SRV6, '80', String(LABEL)]);
    const peer = (JSON.parse(app.stdout) as { peer: [string, number, number, number] }).peer;
    for (let i = 0; i < scaled(50) && !proxy.lines.some((l) => l.includes('"accept"')); i++) await new Promise((r) => setTimeout(r, 100));
    const accepted = proxy.lines.filter((l) => l.includes('"accept"')).map((l) => JSON.parse(l) as { errno: number | string; hex?: string });
    expect(accepted, proxy.stderr()).toHaveLength(1);
    expect(accepted[0]).toEqual({ event: 'accept', errno: 0, hex: sockaddrIn6(SRV6, 80, flow, 0) });
    expect(peer).toEqual([SRV6, 80, LABEL, 0]);
  });

  it('answers a SO_ORIGINAL_DST asked late, after the pod was unregistered, as conntrack keeps answering for a connection it saw', async () => {
    // its own pod: the proxy above still holds [::]:15001
    const late = await lab.netns('odlate');
    const lsrv = await lab.netns('odlatesrv');
    await lab.link(late.name, lsrv.name, { a4: ['198.18.37.1/24'], b4: ['198.18.37.2/24'] });
    await dp.register(late.path, istioCapture({ ips: ['198.18.37.1'], ipv6: false }), ['198.18.37.1']);
    const dir = mkdtempSync(path.join(os.tmpdir(), 'meshcap-odlate-'));
    chmodSync(dir, 0o755);
    const go = path.join(dir, 'ask');
    try {
      const proxy = lab.spawn(late.name, ['/usr/bin/python3', SCRIPT, 'late', go], { uid: 1337, until: /"ready"/ });
      await proxy.ready;
      const app = lab.spawn(late.name, ['/usr/bin/python3', SCRIPT, 'hold', '198.18.37.2', '8443'], { until: /"connected"/ });
      await app.ready;
      for (let i = 0; i < scaled(50) && !proxy.lines.some((l) => l.includes('"accept"')); i++) await new Promise((r) => setTimeout(r, 100));
      await dp.unregister(late.path);
      writeFileSync(go, '');
      for (let i = 0; i < scaled(50) && !proxy.lines.some((l) => l.includes('"late"')); i++) await new Promise((r) => setTimeout(r, 100));
      const answer = proxy.lines.filter((l) => l.includes('"late"')).map((l) => JSON.parse(l) as unknown);
      // struct sockaddr_in: AF_INET, port 8443, 198.18.37.2, zeros
      expect(answer, proxy.stderr()).toEqual([{ event: 'late', errno: 0, hex: '0200' + (8443).toString(16).padStart(4, '0') + 'c6122502' + '00'.repeat(8) }]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
