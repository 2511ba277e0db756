// The pod's address as the redirected connection's source, in the views
// only (issue 19 item 2; docs/datapath.md "The source address"). Where
// peername.bpf.o is attached, connect4 leaves an unbound IPv4 socket sent to
// a slot to routing, so on the wire the connection runs 127.0.0.1 ->
// 127.S:15001 (a route the kernel caches, and no bpf_bind). What the app and
// the proxy read is what REDIRECT gives: the app's getsockname(), the
// proxy's accept() and getpeername() name the pod's address, with the app's
// port. Each case reads the wire from /proc/net/tcp{,6} in the pod beside
// the views, so a build that still bound the pod's address, or one whose
// views gave 127.0.0.1, fails here. A connection sent to 127.0.0.1:15001 (no
// slot) and a datapath loaded without peername.bpf.o keep the bind. The
// same for an AF_INET6 socket to a v4-mapped destination (connect6).
import { execa } from 'execa';
import { copyFileSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { slotAddress, slotCandidates4 } from '../../../src/explain/kernel-verdict.js';
import { bpfObjectDir } from '../../../src/paths.js';
import { describeEbpf, makeDriver, type Driver } from '../../helpers/datapaths.js';
import { Lab, scaled } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

const POD = '198.18.31.1';
const POD_NOVIEW = '198.18.32.1';
const DST = '198.18.31.2';

const ip4 = (a: string) => Buffer.from(a.split('.').map(Number));
const slotOf = (dst: string, port: number) => slotAddress(slotCandidates4(ip4(dst), port)[0]!);

// Run as root in the pod: root is not the proxy's uid, so its connect is
// captured. A listener at 15001 (the family and address given) stands in for
// the proxy; the process connects, accepts, and prints both ends' views and
// what /proc says the connection's addresses are.
const SCRIPT = `
import json, socket, sys
fam, bind_addr, dst, port, app6 = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "6"

def decode(h, v6):
    b = bytes.fromhex(h)
    if not v6:
        return socket.inet_ntoa(b[::-1])
    return socket.inet_ntop(socket.AF_INET6, b"".join(b[i:i + 4][::-1] for i in range(0, 16, 4)))

def wire(v6, lport, rport):
    for line in open("/proc/net/tcp6" if v6 else "/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        (la, lp), (ra, rp) = f[1].split(":"), f[2].split(":")
        if f[3] == "01" and int(lp, 16) == lport and int(rp, 16) == rport:
            return [decode(la, v6), decode(ra, v6)]
    return None

l = socket.socket(socket.AF_INET6 if fam == "6" else socket.AF_INET, socket.SOCK_STREAM)
if fam == "6":
    l.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((bind_addr, 15001))
l.listen(8)
if app6:
    c = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    c.settimeout(5)
    c.connect(("::ffff:" + dst, port))
else:
    c = socket.create_connection((dst, port), timeout=5)
l.settimeout(5)
a, addr = l.accept()
sp = c.getsockname()[1]
print(json.dumps({
    "sock": list(c.getsockname()[:2]), "accept": list(addr[:2]), "peer": list(a.getpeername()[:2]),
    "app": wire(app6, sp, 15001), "proxy": wire(fam == "6", 15001, sp),
}))
`;

const REFUSED = `
__attribute__((section("license"), used)) char LICENSE[] = "GPL";
__attribute__((section("cgroup/getpeername4"), used)) int mc_getpeername4(void *ctx) { return 2; }
`;

interface View { sock: [string, number]; accept: [string, number]; peer: [string, number]; app: [string, string] | null; proxy: [string, string] | null }

describeEbpf('eBPF mode: a slotted IPv4 connection leaves from 127.0.0.1, and the app and the proxy see the pod\'s address', () => {
  const lab = new Lab();
  let dp: Driver;
  let noView: Driver;
  let objects: string;
  let pod: { name: string; path: string };
  let pod2: { name: string; path: string };

  const run = async (ns: string, fam: '4' | '6', bind: string, port: number, app: '4' | '6' = '4'): Promise<View> => {
    const r = await lab.exec(ns, ['/usr/bin/python3', '-c', SCRIPT, fam, bind, DST, String(port), app]);
    return JSON.parse(r.stdout) as View;
  };

  beforeAll(async () => {
    dp = await makeDriver('ebpf');
    // The same objects, with a peername.bpf.o this kernel refuses (its
    // program returns 2, which a sock_addr program may not): the views are
    // unavailable, as on a kernel without the hooks.
    objects = mkdtempSync(path.join(os.tmpdir(), 'meshcap-noview-'));
    for (const f of readdirSync(bpfObjectDir)) if (f.endsWith('.bpf.o') && f !== 'peername.bpf.o') copyFileSync(path.join(bpfObjectDir, f), path.join(objects, f));
    writeFileSync(path.join(objects, 'refused.c'), REFUSED);
    await execa('clang', ['-O2', '-target', 'bpf', '-c', path.join(objects, 'refused.c'), '-o', path.join(objects, 'peername.bpf.o')]);
    noView = await makeDriver('ebpf', { objectDir: objects });
    pod = await lab.netns('srcview');
    pod2 = await lab.netns('srcnoview');
    const srv = await lab.netns('srcsrv');
    const srv2 = await lab.netns('srcsrv2');
    await lab.link(pod.name, srv.name, { a4: [`${POD}/24`], b4: [`${DST}/24`] });
    await lab.link(pod2.name, srv2.name, { a4: [`${POD_NOVIEW}/24`], b4: ['198.18.32.2/24'] });
    await dp.register(pod.path, istioCapture({ ips: [POD], ipv6: false }), [POD]);
    await noView.register(pod2.path, istioCapture({ ips: [POD_NOVIEW], ipv6: false }), [POD_NOVIEW]);
  }, scaled(120_000));

  afterAll(async () => {
    await dp?.close();
    await noView?.close();
    await lab.cleanup();
    if (objects) rmSync(objects, { recursive: true, force: true });
  });

  it('an IPv4 proxy on 0.0.0.0: 127.0.0.1 -> 127.S on the wire; getsockname, accept() and getpeername name the pod\'s address', async () => {
    const v = await run(pod.name, '4', '0.0.0.0', 80);
    const S = slotOf(DST, 80);
    const port = v.sock[1];
    expect(v).toEqual({ sock: [POD, port], accept: [POD, port], peer: [POD, port], app: ['127.0.0.1', S], proxy: [S, '127.0.0.1'] });
  }, scaled(30_000));

  it('a dual-stack proxy on [::]: its v4-mapped accept() and getpeername name the pod\'s address too', async () => {
    const v = await run(pod.name, '6', '::', 81);
    const S = slotOf(DST, 81);
    const port = v.sock[1];
    expect(v).toEqual({ sock: [POD, port], accept: [`::ffff:${POD}`, port], peer: [`::ffff:${POD}`, port], app: ['127.0.0.1', S], proxy: [`::ffff:${S}`, '::ffff:127.0.0.1'] });
  }, scaled(30_000));

  it('an app\'s AF_INET6 socket to a v4-mapped destination: ::ffff:127.0.0.1 on the wire, its getsockname the pod\'s v4-mapped address', async () => {
    const v = await run(pod.name, '4', '0.0.0.0', 83, '6');
    const S = slotOf(DST, 83);
    const port = v.sock[1];
    expect(v).toEqual({ sock: [`::ffff:${POD}`, port], accept: [POD, port], peer: [POD, port], app: ['::ffff:127.0.0.1', `::ffff:${S}`], proxy: [S, '127.0.0.1'] });
  }, scaled(30_000));

  it('a proxy on 127.0.0.1 only (no slot): the connection keeps the bind, the pod\'s address on the wire', async () => {
    const v = await run(pod.name, '4', '127.0.0.1', 82);
    const port = v.sock[1];
    expect(v).toEqual({ sock: [POD, port], accept: [POD, port], peer: [POD, port], app: [POD, '127.0.0.1'], proxy: ['127.0.0.1', POD] });
  }, scaled(30_000));

  it('without peername.bpf.o the slot is used and the pod\'s address is bound, on the wire and in the views', async () => {
    const v = await run(pod2.name, '4', '0.0.0.0', 80);
    const S = slotOf(DST, 80);
    const port = v.sock[1];
    expect(v).toEqual({ sock: [POD_NOVIEW, port], accept: [POD_NOVIEW, port], peer: [POD_NOVIEW, port], app: [POD_NOVIEW, S], proxy: [S, POD_NOVIEW] });
  }, scaled(30_000));
});
