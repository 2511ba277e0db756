// sockops' path for connections an older connect4 redirected (one that kept
// the original destination in mc_sockorig, keyed by socket cookie, before
// 2026-11-25): during an upgrade the programs are replaced one at a time,
// and a connection the old connect4 sent to 127.0.0.1 must still reach its
// destination through the new sockops. Such a connection is simulated here:
// the app's socket's cookie is read before connect() and its entry written
// into mc_sockorig, as the old connect4 would, then the socket connects to
// the proxy at 127.0.0.1.
//
// Only that path may look mc_sockorig up. Every other loopback connection on
// the node (unmeshed pods, the host, a meshed pod's own connection to another
// 127.x address) skips it: the cookie it would make and the lookup of a
// random key in a 16,384-entry LRU cost about 0.2 µs of every such connect.
// The entries written for those sockets below are left in place; the build
// before consumed them.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { loadDatapath, uninstallDatapath } from '../../../src/loader/datapath.js';
import { pinLayout } from '../../../src/loader/manifest.js';
import * as bpf from '../../../src/native/addon.js';
import { MAP, mcOrig } from '../../../src/maps/layout.js';
import { EbpfBackend } from '../../../src/pod-datapath/ebpf.js';
import { describeEbpf } from '../../helpers/datapaths.js';
import { Lab, scaled, testPinRoot } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

const POD = '198.18.47.2';
const SRV = '198.18.47.1';
const PLAIN = '198.18.47.6';

// An app socket: print its cookie, connect once told to (a line on stdin),
// send, half-close, print what came back.
const APP = `
import json, socket, struct, sys
host, port = sys.argv[1], int(sys.argv[2])
c = socket.socket(); c.settimeout(5)
print(json.dumps({"cookie": str(struct.unpack("=Q", c.getsockopt(socket.SOL_SOCKET, 57, 8))[0])}), flush=True)
sys.stdin.readline()
try:
    c.connect((host, port)); c.sendall(b"old"); c.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        d = c.recv(4096)
        if not d: break
        data += d
    print(json.dumps({"data": data.decode("latin1")}), flush=True)
except OSError as e:
    print(json.dumps({"error": str(e)}), flush=True)
`;

describeEbpf('sockops reads mc_sockorig (an older connect4\'s) only for a meshed pod\'s connection to 127.0.0.1', () => {
  const lab = new Lab();
  const pinRoot = testPinRoot();
  let be: EbpfBackend;
  let pod: { name: string; path: string }, plain: typeof pod;
  let proxy: Awaited<ReturnType<Lab['proxy']>>;
  let sockorig: number;

  beforeAll(async () => {
    await loadDatapath({ pinRoot });
    be = new EbpfBackend(pinRoot);
    pod = await lab.netns('sockorig');
    plain = await lab.netns('sockorigplain');
    const srv = await lab.netns('sockorigsrv');
    await lab.link(pod.name, srv.name, { a4: [`${POD}/24`], b4: [`${SRV}/24`] });
    const s = await lab.agent(srv.name);
    await s.listen(SRV, 80);
    const p = await lab.agent(plain.name);
    await p.listen('127.0.0.1', 15001);
    await be.register({ netns: pod.path, config: istioCapture({ ips: [POD] }), podIPs: [POD] });
    proxy = await lab.proxy(pod.name);
    sockorig = bpf.objGet(`${pinLayout(pinRoot).maps}/${MAP.sockorig}`);
  }, scaled(120_000));

  afterAll(async () => {
    if (sockorig !== undefined) bpf.closeFd(sockorig);
    be?.close();
    uninstallDatapath(pinRoot);
    await lab.cleanup();
  });

  const key = (cookie: string) => {
    const k = Buffer.alloc(8);
    k.writeBigUInt64LE(BigInt(cookie));
    return k;
  };

  /** Connects an app socket whose mc_sockorig entry (SRV:80) was written first; returns what it got and whether the entry is still there. */
  async function oldConnect(ns: string, nsPath: string, host: string, port: number): Promise<{ got: Record<string, string>; left: boolean }> {
    const app = lab.spawn(ns, ['setpriv', '--reuid=1000', '--regid=1000', '--clear-groups', '/usr/bin/python3', '-c', APP, host, String(port)], { until: /cookie/ });
    await app.ready;
    const { cookie } = JSON.parse(app.lines[0]!) as { cookie: string };
    const netns = await bpf.netnsCookie(nsPath);
    const addr = Buffer.alloc(16);
    addr.writeUInt16BE(0xffff, 10);
    SRV.split('.').forEach((o, i) => addr.writeUInt8(Number(o), 12 + i));
    bpf.mapUpdate(sockorig, key(cookie), mcOrig.encode({ addr, port: 80, family: 4, kind: 1, pad: 0, netns }), 0);
    app.proc.stdin!.write('go\n');
    const deadline = Date.now() + scaled(10_000);
    while (app.lines.length < 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(app.lines.length, app.stderr()).toBe(2);
    const left = bpf.mapLookup(sockorig, key(cookie), mcOrig.size) !== null;
    if (left) bpf.mapDelete(sockorig, key(cookie));
    return { got: JSON.parse(app.lines[1]!) as Record<string, string>, left };
  }

  it('carries the original destination of a meshed pod\'s connection to 127.0.0.1 to the proxy', async () => {
    const before = proxy.accepts().length;
    const r = await oldConnect(pod.name, pod.path, '127.0.0.1', 15001);
    expect(r.got).toEqual({ data: `${SRV}:80|old` });
    expect(r.left, 'the entry was consumed').toBe(false);
    expect(proxy.accepts().slice(before).map((a) => a.orig)).toEqual([`${SRV}:80`]);
  });

  it('does not look it up for a connection in a netns that is not meshed', async () => {
    const r = await oldConnect(plain.name, plain.path, '127.0.0.1', 15001);
    expect(r.got).toEqual({ data: '127.0.0.1:15001|old' });
    expect(r.left).toBe(true);
  });

  it('does not look it up for a meshed pod\'s connection to another loopback address', async () => {
    const before = proxy.accepts().length;
    const r = await oldConnect(pod.name, pod.path, '127.0.0.9', 15001);
    expect(r.left).toBe(true);
    // the proxy took it with no original destination (it names none: 127.0.0.9 is no slot)
    expect(proxy.accepts().slice(before).map((a) => a.orig)).not.toContain(`${SRV}:80`);
  });
});
