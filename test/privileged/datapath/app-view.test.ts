// The app's own view of a redirected socket must be what iptables REDIRECT
// leaves (issue 16, item 5): getpeername() the original destination,
// getsockname() the pod's address, for TCP over IPv4, IPv6 and v4-mapped
// IPv6, and for a UDP socket connected to a resolver with DNS capture on.
// Checked in both modes with the same expectations, on connections the
// proxy really accepted (so a pass cannot come from a capture that never
// happened). A kernel that refuses the optional peername.bpf.o (hooks are
// 5.8+) must give the documented loopback view instead, never a wrong one.
import { existsSync } from 'node:fs';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { pinLayout } from '../../../src/loader/manifest.js';
import { describeModes, makeDriver, type Driver } from '../../helpers/datapaths.js';
import { appPython, Lab, scaled } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

const POD4 = '198.18.24.1';
const POD6 = '2001:db8:24::1';
const SRV4 = '198.18.24.2';
const SRV6 = '2001:db8:24::2';

// One line of JSON per socket: what the app sees.
const PROBE = `
import json, socket
def tcp(fam, host, port):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect((host, port))
    out = {"peer": list(s.getpeername()[:2]), "sock": list(s.getsockname()[:2])}
    s.close()
    return out
def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((host, port))
    out = {"peer": list(s.getpeername()[:2]), "sock": list(s.getsockname()[:2])}
    s.close()
    return out
print(json.dumps({
    "tcp4": tcp(socket.AF_INET, "${SRV4}", 80),
    "tcp6": tcp(socket.AF_INET6, "${SRV6}", 80),
    "mapped": tcp(socket.AF_INET6, "::ffff:${SRV4}", 80),
    "udp4": udp("${SRV4}", 53),
}))
`;

// A TCP socket whose redirected connect() failed (DNS over TCP goes to the
// proxy's 15053, where it answers UDP only) and that then connects again:
// its peer is the new destination, redirected or not, never the old one.
const AGAIN = `
import json, socket
def again(host, port):
    s = socket.socket()  # blocking: with a timeout Python's second connect() fails ECONNABORTED
    try:
        s.connect(("${SRV4}", 53))
        first = "connected"
    except ConnectionRefusedError:
        first = "refused"
    s.connect((host, port))
    out = {"first": first, "peer": list(s.getpeername()[:2])}
    s.close()
    return out
print(json.dumps({"captured": again("${SRV4}", 80), "direct": again("127.0.0.1", 15001)}))
`;

describeModes('what the app sees of its redirected sockets, %s mode', (mode) => {
  const lab = new Lab();
  let dp: Driver;
  let pod: { name: string; path: string };
  let proxy: Awaited<ReturnType<Lab['proxy']>>;

  beforeAll(async () => {
    dp = await makeDriver(mode);
    pod = await lab.netns('view');
    const srv = await lab.netns('viewsrv');
    await lab.link(pod.name, srv.name, { a4: [`${POD4}/24`], a6: [`${POD6}/64`], b4: [`${SRV4}/24`], b6: [`${SRV6}/64`] });
    const server = await lab.agent(srv.name);
    await server.listen(SRV4, 80);
    await server.listen(SRV6, 80);
    await dp.register(pod.path, istioCapture({ ips: [POD4, POD6], proxyEnv: { ISTIO_META_DNS_CAPTURE: 'true' }, ipv6: true }), [POD4, POD6]);
    proxy = await lab.proxy(pod.name, ['--dns', '15053']);
  }, scaled(120_000));

  afterAll(async () => {
    await dp?.close();
    await lab.cleanup();
  });

  it('getpeername is the original destination and getsockname the pod address, as under REDIRECT', async () => {
    const before = proxy.accepts().filter((a) => a.listener !== 'inbound').length;
    const v = await appPython<Record<string, { peer: [string, number]; sock: [string, number] }>>(pod.name, PROBE);
    // the three TCP connections were captured: the proxy accepted them
    for (let i = 0; i < 20 && proxy.accepts().filter((a) => a.listener !== 'inbound').length < before + 3; i++) await new Promise((res) => setTimeout(res, 50));
    expect(proxy.accepts().filter((a) => a.listener !== 'inbound').length).toBe(before + 3);
    const hooked = mode === 'iptables' || existsSync(pinLayout(dp.ebpf!.pinRoot).link('mc_getpeername4'));
    if (!hooked) {
      // docs/datapath.md: without the hooks the app's peer is the proxy on
      // loopback; its own address is the pod's either way (bound before the rewrite)
      expect(v.tcp4!.peer).toEqual(['127.0.0.1', 15001]);
      expect(v.tcp6!.peer).toEqual(['::1', 15001]);
      expect(v.tcp4!.sock[0]).toBe(POD4);
      return;
    }
    expect(v.tcp4!.peer).toEqual([SRV4, 80]);
    expect(v.tcp4!.sock[0]).toBe(POD4);
    expect(v.tcp6!.peer).toEqual([SRV6, 80]);
    expect(v.tcp6!.sock[0]).toBe(POD6);
    expect(v.mapped!.peer).toEqual([`::ffff:${SRV4}`, 80]);
    expect(v.mapped!.sock[0]).toBe(`::ffff:${POD4}`);
    expect(v.udp4!.peer).toEqual([SRV4, 53]);
    expect(v.udp4!.sock[0]).toBe(POD4);
  });

  it('a socket connected again after a refused redirect sees its new peer', async () => {
    const hooked = mode === 'iptables' || existsSync(pinLayout(dp.ebpf!.pinRoot).link('mc_getpeername4'));
    const v = await appPython<Record<string, { first: string; peer: [string, number] }>>(pod.name, AGAIN);
    expect(v.captured).toEqual({ first: 'refused', peer: hooked ? [SRV4, 80] : ['127.0.0.1', 15001] });
    expect(v.direct).toEqual({ first: 'refused', peer: ['127.0.0.1', 15001] });
  });
});
