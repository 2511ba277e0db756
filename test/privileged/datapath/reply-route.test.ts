// The route of redirected connections' replies (issue 19 item 2). A
// redirected connection leaves from the pod's address, as under REDIRECT, and
// the kernel caches no route to that address through the pod's interface, so
// the proxy's SYN-ACK and accepted socket each allocated one. eBPF mode's
// register adds `local <pod IPv4> dev lo` in table 15001, looked up by
// `pref 0 from 127.0.0.0/8 to <pod IPv4> ipproto tcp` ahead of the local
// table's rule: the kernel caches that route. Scoped so, nothing but the
// proxy's (and Envoy's passthrough's) TCP replies change their route: the
// pod's own connection to its address still arrives on its interface, where
// a listener bound to that interface takes it (a plain `local <pod> dev lo`
// route in the local table would refuse it: this test fails with one).
import { existsSync, readlinkSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadDatapath, uninstallDatapath } from '../../../src/loader/datapath.js';
import * as bpf from '../../../src/native/addon.js';
import { EbpfBackend } from '../../../src/pod-datapath/ebpf.js';
import { REPLY_ROUTE_PROTOCOL, REPLY_ROUTE_TABLE } from '../../../src/pod-netns.js';
import { describeEbpf } from '../../helpers/datapaths.js';
import { appPython, Lab, scaled, testPinRoot } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

const POD = '198.18.31.2';
const SRV = '198.18.31.1';
const POD6 = '2001:db8:31::2';
const NOT_THE_PODS = '198.18.31.99';
const OURS = `from 127.0.0.0/8 to ${POD} ipproto tcp lookup ${REPLY_ROUTE_TABLE}`;

const rules = async (lab: Lab, ns: string) => (await lab.exec(ns, ['ip', '-4', 'rule', 'show'])).stdout.split('\n').map((l) => l.trim().replace(/\s+/g, ' '));
const table = async (lab: Lab, ns: string) => (await lab.exec(ns, ['ip', '-4', 'route', 'show', 'table', String(REPLY_ROUTE_TABLE)])).stdout.trim();
const routeGet = async (lab: Lab, ns: string, args: string[]) => (await lab.exec(ns, ['ip', '-4', 'route', 'get', ...args])).stdout.replace(/\s+/g, ' ').trim();

// The app connects to its own address at a listener bound to the pod's
// interface (SO_BINDTODEVICE), and to a captured destination (the proxy
// answers); prints what each got.
const SELF = `
import json, socket, sys
pod, ifname, srv = sys.argv[1], sys.argv[2], sys.argv[3]
out = {}
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode())
l.bind(("0.0.0.0", 18080)); l.listen(8)
c = socket.socket(); c.settimeout(3)
try:
    c.connect((pod, 18080)); a, peer = l.accept(); out["self"] = peer[0]; a.close()
except OSError as e:
    out["self"] = "error: " + str(e)
c.close()
c = socket.socket(); c.settimeout(5)
c.connect((srv, 80)); c.sendall(b"x"); out["echo"] = c.recv(1).decode(); out["sock"] = c.getsockname()[0]; out["peer"] = c.getpeername()[0]
c.close()
print(json.dumps(out))
`;

describeEbpf('the replies of redirected connections route on lo, for TCP from 127.0.0.0/8 only', () => {
  const lab = new Lab();
  const pinRoot = testPinRoot();
  let be: EbpfBackend;
  let pod: { name: string; path: string };
  let podIf: string;
  let proxy: Awaited<ReturnType<Lab['proxy']>>;
  const setup = () => ({ netns: pod.path, config: istioCapture({ ips: [POD, POD6] }), podIPs: [POD, POD6, NOT_THE_PODS] });

  beforeAll(async () => {
    await loadDatapath({ pinRoot });
    be = new EbpfBackend(pinRoot);
    pod = await lab.netns('replyrt');
    const srv = await lab.netns('replyrtsrv');
    podIf = (await lab.link(pod.name, srv.name, { a4: [`${POD}/24`], b4: [`${SRV}/24`], a6: [`${POD6}/64`], b6: ['2001:db8:31::1/64'] })).aIf;
    await be.register(setup());
    proxy = await lab.proxy(pod.name, ['--echo']);
  }, scaled(120_000));

  afterAll(async () => {
    be?.close();
    uninstallDatapath(pinRoot);
    await lab.cleanup();
  });

  it('puts its rule before the local table\'s, both at pref 0, and the route in its own table', async () => {
    const r = await rules(lab, pod.name);
    expect(r.slice(0, 2)).toEqual([`0: ${OURS}`, '0: from all lookup local']);
    expect(r.filter((l) => l.includes('lookup local'))).toHaveLength(1);
    expect(await table(lab, pod.name)).toBe(`local ${POD} dev lo proto ${REPLY_ROUTE_PROTOCOL} scope host src ${POD}`);
    // an address the netns does not have is not made local
    expect(r.join('\n')).not.toContain(NOT_THE_PODS);
  });

  it('routes the proxy\'s TCP replies on lo, and everything else to the pod\'s address as the kernel does', async () => {
    expect(await routeGet(lab, pod.name, [POD, 'from', '127.0.0.7', 'ipproto', 'tcp'])).toContain(`dev lo table ${REPLY_ROUTE_TABLE}`);
    expect(await routeGet(lab, pod.name, [POD, 'from', '127.0.0.7', 'ipproto', 'udp'])).toContain('table local');
    expect(await routeGet(lab, pod.name, [POD, 'from', POD, 'ipproto', 'tcp'])).toContain('table local');
  });

  it('keeps the pod\'s own connection to its address on its interface, and redirects as before', async () => {
    const before = proxy.accepts().length;
    const v = await appPython<Record<string, string>>(pod.name, SELF, { args: [POD, podIf, SRV] });
    expect(v.self, 'a listener bound to the pod\'s interface takes the pod\'s own connection').toBe(POD);
    expect(v).toMatchObject({ echo: 'x', sock: POD, peer: SRV });
    const got = proxy.accepts().slice(before);
    expect(got).toHaveLength(1);
    expect(got[0]!.peer).toContain(POD);
    expect(got[0]!.orig).toContain(SRV);
  });

  it('is the same after a second register, and puts its rule first again where the local table\'s came before it', async () => {
    await be.register(setup());
    expect((await rules(lab, pod.name)).slice(0, 3)).toEqual([`0: ${OURS}`, '0: from all lookup local', '32766: from all lookup main']);
    // as an add that stopped half-way leaves it: the local table's rule first
    await lab.exec(pod.name, ['ip', 'rule', 'del', 'pref', '0', 'from', '127.0.0.0/8', 'to', POD, 'ipproto', 'tcp', 'lookup', String(REPLY_ROUTE_TABLE)]);
    await lab.exec(pod.name, ['ip', 'rule', 'add', 'pref', '0', 'from', '127.0.0.0/8', 'to', POD, 'ipproto', 'tcp', 'lookup', String(REPLY_ROUTE_TABLE)]);
    expect((await rules(lab, pod.name))[0]).toBe('0: from all lookup local');
    await be.register(setup());
    const r = await rules(lab, pod.name);
    expect(r[0]).toBe(`0: ${OURS}`);
    expect(r.indexOf(`0: ${OURS}`)).toBeLessThan(r.indexOf('0: from all lookup local'));
  });

  it('is taken out by unregister, leaving the rules as the kernel made them', async () => {
    const cookie = await bpf.netnsCookie(pod.path);
    await be.unregister(setup(), cookie);
    expect((await rules(lab, pod.name)).filter((l) => l !== '')).toEqual(['0: from all lookup local', '32766: from all lookup main', '32767: from all lookup default']);
    expect(await table(lab, pod.name)).toBe('');
    // again: nothing to take out
    await be.unregister(setup(), cookie);
    expect(readlinkSync('/proc/thread-self/ns/net')).toBe(ownNetns);
  });
});

// The JS thread's netns: each call steps into the pod's for one socket() and back.
const ownNetns = readlinkSync('/proc/thread-self/ns/net');

const thrown = (f: () => unknown): unknown => {
  try {
    f();
  } catch (e) {
    return e;
  }
  throw new Error('did not throw');
};

describe('netnsReplyRoutes refuses what it must not touch', () => {
  it('refuses the kernel\'s own tables, protocols below 5 and a bad op, as a TypeError', () => {
    expect(() => bpf.netnsReplyRoutes('/proc/self/ns/net', 'add', [], 254, REPLY_ROUTE_PROTOCOL)).toThrow(/kernel's own/);
    expect(() => bpf.netnsReplyRoutes('/proc/self/ns/net', 'add', [], REPLY_ROUTE_TABLE, 2)).toThrow(/protocol/);
    expect(() => bpf.netnsReplyRoutes('/proc/self/ns/net', 'flush' as 'add', [], REPLY_ROUTE_TABLE, REPLY_ROUTE_PROTOCOL)).toThrow(/op must be/);
  });

  it('rejects an address that is not IPv4 with EINVAL, naming it, and a netns that is not there with ENOENT', async () => {
    const lab = new Lab();
    try {
      const ns = await lab.netns('replyrtbad');
      expect(thrown(() => bpf.netnsReplyRoutes(ns.path, 'add', ['2001:db8::1'], REPLY_ROUTE_TABLE, REPLY_ROUTE_PROTOCOL))).toMatchObject({ code: 'EINVAL', message: expect.stringContaining('2001:db8::1') });
    } finally {
      await lab.cleanup();
    }
    const gone = '/run/netns/meshcap-test-no-such-netns';
    expect(existsSync(gone)).toBe(false);
    expect(thrown(() => bpf.netnsReplyRoutes(gone, 'add', [POD], REPLY_ROUTE_TABLE, REPLY_ROUTE_PROTOCOL))).toMatchObject({ code: 'ENOENT', syscall: 'open' });
    // the calling (JS) thread is back in its own netns after each
    expect(readlinkSync('/proc/thread-self/ns/net')).toBe(ownNetns);
  });
});

