// The route of redirected connections' replies (issue 19 item 2). eBPF-mode
// builds from 0b6b34f to eed882e (2026-11-30) gave each pod `local <pod IPv4>
// dev lo` in table 15001, looked up by `pref 0 from 127.0.0.0/8 to <pod IPv4>
// ipproto tcp` ahead of the local table, so the proxy's replies took a route
// the kernel caches. It was taken back: a rule in a netns sends every route
// lookup there through the rules for good, which cost the whole path more
// than the replies gained (docs/bench-datapath.md). So: register leaves the
// pod's routing as the kernel made it, unregister takes the route out of a
// pod an earlier build gave it, and a pod without it sees no rule written,
// not even for a moment (that alone would keep it on the slow path).
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
const OURS = `from 127.0.0.0/8 to ${POD} ipproto tcp lookup ${REPLY_ROUTE_TABLE}`;
const KERNELS = ['0: from all lookup local', '32766: from all lookup main', '32767: from all lookup default'];

const rules = async (lab: Lab, ns: string) => (await lab.exec(ns, ['ip', '-4', 'rule', 'show'])).stdout.split('\n').map((l) => l.trim().replace(/\s+/g, ' ')).filter((l) => l !== '');
// '' also where the table was never made (ip exits 2: "FIB table does not exist")
const table = async (lab: Lab, ns: string) => {
  const r = await lab.exec(ns, ['ip', '-4', 'route', 'show', 'table', String(REPLY_ROUTE_TABLE)]).catch((e: { stderr?: string }) => {
    if (e.stderr?.includes('does not exist')) return { stdout: '' };
    throw e;
  });
  return r.stdout.trim();
};
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

describeEbpf('the replies of redirected connections keep the kernel\'s routes', () => {
  const lab = new Lab();
  const pinRoot = testPinRoot();
  let be: EbpfBackend;
  let pod: { name: string; path: string };
  let podIf: string;
  let proxy: Awaited<ReturnType<Lab['proxy']>>;
  const setup = () => ({ netns: pod.path, config: istioCapture({ ips: [POD, POD6] }), podIPs: [POD, POD6] });

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

  it('register leaves the pod\'s rules and routes as the kernel made them', async () => {
    expect(await rules(lab, pod.name)).toEqual(KERNELS);
    expect(await table(lab, pod.name)).toBe('');
    expect(await routeGet(lab, pod.name, [POD, 'from', '127.0.0.7', 'ipproto', 'tcp'])).not.toContain(`table ${REPLY_ROUTE_TABLE}`);
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

  it('unregister of a pod without the route writes no rule, not even for a moment', async () => {
    const cookie = await bpf.netnsCookie(pod.path);
    const mon = lab.spawn(pod.name, ['ip', 'monitor', 'rule', 'route']);
    await new Promise((r) => setTimeout(r, 300));
    await be.unregister(setup(), cookie);
    await new Promise((r) => setTimeout(r, 300));
    mon.proc.kill('SIGTERM');
    await mon.proc;
    expect(mon.lines, mon.stderr()).toEqual([]);
    expect(await rules(lab, pod.name)).toEqual(KERNELS);
    await be.register(setup());
  });

  it('unregister takes out the route an earlier build added, leaving the kernel\'s rules', async () => {
    // as the builds from 0b6b34f to eed882e left a pod
    bpf.netnsReplyRoutes(pod.path, 'add', [POD], REPLY_ROUTE_TABLE, REPLY_ROUTE_PROTOCOL);
    expect((await rules(lab, pod.name)).slice(0, 2)).toEqual([`0: ${OURS}`, '0: from all lookup local']);
    expect(await table(lab, pod.name)).toBe(`local ${POD} dev lo proto ${REPLY_ROUTE_PROTOCOL} scope host src ${POD}`);
    const cookie = await bpf.netnsCookie(pod.path);
    await be.unregister(setup(), cookie);
    expect(await rules(lab, pod.name)).toEqual(KERNELS);
    expect(await table(lab, pod.name)).toBe('');
    // again: nothing to take out
    await be.unregister(setup(), cookie);
    expect(await rules(lab, pod.name)).toEqual(KERNELS);
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

