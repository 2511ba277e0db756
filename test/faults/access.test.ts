// Access (docs/reliability.md): who can change a pod's capture. The agent's
// CNI socket and state dir are root-only and the agent refuses any peer that
// is not uid 0 (SO_PEERCRED), with a log line; a non-root process in a meshed
// pod cannot undo its own or another pod's capture (iptables, BPF pins, the
// CNI socket, another pod's netns), cannot pass as the proxy's uid 1337
// through a user namespace, and binding 127.0.0.6 or picking another port
// does not take it past the sidecar. What Istio's model lets through by
// design (the proxy's own uid, UDP other than DNS) goes through in both
// modes alike, and is asserted as such. Both node modes; real agent process,
// real forwarder ADD, the reference proxy as uid 1337.
import { mkdirSync, mkdtempSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { stringify } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentProcess, endAgentRun } from '../helpers/agent-process.js';
import { podBesideServer } from '../helpers/agent-fixture.js';
import { MODES } from '../helpers/datapaths.js';
import { Lab, testPinRoot, type NsAgent } from '../helpers/lab.js';
import { istioPod } from '../helpers/pods.js';
import { cni, requireCniBinary, type CniCall } from '../privileged/agent/cni-harness.js';

const APP_UID = 1000;
// Debian's python3 (scripts/setup.sh), not whatever PATH finds first: uid 1000 must be able to run it
const PY = '/usr/bin/python3';

// A TCP client: connect (optionally from a bound address), send, half-close,
// read; prints what happened and who it ran as.
const PY_CONNECT = `
import json, os, socket, sys
host, port, src = sys.argv[1], int(sys.argv[2]), sys.argv[3]
out = {"uid": os.getuid(), "gid": os.getgid()}
try:
    s = socket.socket()
    if src: s.bind((src, 0))
    s.settimeout(5)
    s.connect((host, port))
    s.sendall(b"hello"); s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        b = s.recv(4096)
        if not b: break
        data += b
    out["data"] = data.decode("latin1"); out["local"] = "%s:%d" % s.getsockname()[:2]
except Exception as e:
    out["error"] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
`;
// Raw and packet sockets (a user-space TCP stack would need one to go around a connect hook).
const PY_RAW = `
import json, socket
out = {}
for name, args in (("inet_raw_tcp", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)), ("packet", (socket.AF_PACKET, socket.SOCK_RAW, 0))):
    try:
        socket.socket(*args).close(); out[name] = "opened"
    except Exception as e:
        out[name] = type(e).__name__
print(json.dumps(out))
`;
// Speaks the wire protocol to the agent's socket as whoever runs it.
const PY_WIRE = `
import json, socket, sys
out = {}
try:
    s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])
    s.sendall(sys.argv[2].encode()); s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        b = s.recv(65536)
        if not b: break
        data += b
    out["reply"] = json.loads(data)
except Exception as e:
    out["error"] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
`;

for (const mode of MODES) {
  describe(`access: a non-root process cannot change capture (${mode} node)`, () => {
    const lab = new Lab();
    const pinRoot = testPinRoot();
    let tmp: string;
    let agent: AgentProcess;
    let socket: string;
    let stateDir: string;
    let pod: { name: string; path: string };
    let other: { name: string; path: string };
    let app: NsAgent;
    let proxy: Awaited<ReturnType<Lab['proxy']>>;
    let call: CniCall;

    const run = async (ns: string, cmd: string[], uid = APP_UID, caps: string[] = []): Promise<Record<string, unknown>> => {
      const r = await lab.exec(ns, cmd, { uid, caps }).catch((e: { stdout?: string; stderr?: string; exitCode?: number }) => e);
      try {
        return JSON.parse(String(r.stdout)) as Record<string, unknown>;
      } catch {
        return { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr };
      }
    };
    const accepted = (orig: string) => proxy.accepts().filter((a) => a.orig === orig).length;
    /** Whether a connection to 198.18.61.2:port made by `fn` went through the proxy. */
    async function viaProxy(port: number, fn: () => Promise<Record<string, unknown>>): Promise<{ captured: boolean; out: Record<string, unknown> }> {
      const before = accepted(`198.18.61.2:${port}`);
      const out = await fn();
      return { captured: accepted(`198.18.61.2:${port}`) === before + 1, out };
    }
    const checkPasses = async () => (await cni('CHECK', call)).exitCode === 0;

    beforeAll(async () => {
      requireCniBinary();
      if (process.getuid?.() !== 0) throw new Error('access tests run as root (they start the agent and drop to uid 1000 / 1337 themselves)');
      tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-access-'));
      const pods = path.join(tmp, 'pods.yaml');
      writeFileSync(pods, [istioPod({ name: 'web' }), istioPod({ name: 'other' })].map((p) => stringify(p)).join('---\n'));
      socket = path.join(tmp, 'run', 'cni.sock');
      stateDir = path.join(tmp, 'state');
      // a state dir that already exists with a wide mode (an operator's mkdir)
      mkdirSync(stateDir, { mode: 0o755 });
      ({ pod, app } = await podBesideServer(lab, 'acc', { a4: ['198.18.61.1/24'], b4: ['198.18.61.2/24'] }, ['198.18.61.2'], 80));
      const server = (await podBesideServer(lab, 'acc2', { a4: ['198.18.62.1/24'], b4: ['198.18.62.2/24'] }, ['198.18.62.2'], 80));
      other = server.pod;
      // the server also listens on 8080 and UDP 9999 (pod netns 'acc' is linked to 'accsrv')
      const srvNs = `mc-accsrv-${lab.id}`;
      const srv = await lab.agent(srvNs);
      await srv.listen('198.18.61.2', 8080);
      await srv.call('udpServe', { host: '198.18.61.2', port: 9999 });
      app = await lab.agent(pod.name, { uid: APP_UID });
      proxy = await lab.proxy(pod.name);
      agent = await AgentProcess.start({ pods, socket, pinRoot, stateDir, mode });
      call = { socket, containerId: 'c-web', netns: pod.path, pod: 'web', podAddress: '198.18.61.1/24' };
      for (const c of [call, { socket, containerId: 'c-other', netns: other.path, pod: 'other', podAddress: '198.18.62.1/24' }]) {
        const r = await cni('ADD', c);
        expect(r.exitCode, r.stdout).toBe(0);
      }
    }, 120_000);

    afterAll(() => endAgentRun({ agent, lab, pinRoot, tmp }));

    it('the CNI socket is 0600 in a 0700 directory, the state dir 0700 (also when it existed wider), records 0600', () => {
      expect(statSync(socket).mode & 0o777).toBe(0o600);
      expect(statSync(path.dirname(socket)).mode & 0o777).toBe(0o700);
      expect(statSync(stateDir).mode & 0o777).toBe(0o700);
      expect(statSync(path.join(stateDir, 'c-web@eth0.json')).mode & 0o777).toBe(0o600);
    });

    it('a non-root process cannot reach the CNI socket; with CAP_DAC_OVERRIDE it connects and the agent refuses it by SO_PEERCRED, saying so in a log line; the capture stays', async () => {
      const del = JSON.stringify({ v: 1, command: 'DEL', containerId: 'c-web', netns: pod.path, ifname: 'eth0', args: 'K8S_POD_NAMESPACE=default;K8S_POD_NAME=web', stdin: JSON.stringify({ cniVersion: '1.1.0', name: 'n', type: 'meshcap-cni' }) });
      const plain = await run(pod.name, [PY, '-c', PY_WIRE, socket, del]);
      expect(String(plain.error)).toMatch(/PermissionError/);
      const logsBefore = agent.logs.length;
      const dac = await run(pod.name, [PY, '-c', PY_WIRE, socket, del], APP_UID, ['dac_override']);
      const reply = dac.reply as { exitCode: number; stdout: string } | undefined;
      expect(reply, JSON.stringify(dac)).toBeDefined();
      expect(reply!.exitCode).toBe(1);
      expect(JSON.parse(reply!.stdout)).toMatchObject({ code: 999, msg: expect.stringContaining(`runs as uid ${APP_UID}, and only root (uid 0) may use the CNI socket`) });
      expect(reply).not.toHaveProperty('agent'); // nothing about the agent for a stranger
      const line = agent.logs.slice(logsBefore).find((l) => l.msg === 'refused a CNI connection from a process that is not root');
      expect(line, JSON.stringify(agent.logs.slice(logsBefore))).toMatchObject({ level: 40, peerUid: APP_UID, peerGid: APP_UID });
      expect(typeof line!.peerPid).toBe('number');
      expect(statSync(path.join(stateDir, 'c-web@eth0.json')).isFile()).toBe(true);
      expect(await checkPasses()).toBe(true);
      // root still gets served
      expect((await cni('CHECK', call)).exitCode).toBe(0);
    });

    it('a non-root app cannot flush its iptables, read or write the pinned maps, or enter another pod\'s netns', async () => {
      const flush = await run(pod.name, ['iptables', '-t', 'nat', '-F']);
      expect(flush.exitCode).not.toBe(0);
      const maps = path.join(pinRoot, 'maps', 'mc_pods');
      if (mode === 'ebpf') {
        const dump = await run(pod.name, ['bpftool', 'map', 'dump', 'pinned', maps]);
        expect(dump.exitCode, String(dump.stderr)).not.toBe(0);
        const del = await run(pod.name, ['bpftool', 'map', 'delete', 'pinned', maps, 'key', ...'0 0 0 0 0 0 0 0'.split(' ')]);
        expect(del.exitCode).not.toBe(0);
      }
      const enter = await run(pod.name, ['nsenter', `--net=${other.path}`, 'true']);
      expect(enter.exitCode).not.toBe(0);
      expect(await checkPasses()).toBe(true);
      expect((await cni('CHECK', { socket, containerId: 'c-other', netns: other.path, pod: 'other', podAddress: '198.18.62.1/24' })).exitCode).toBe(0);
      const r = await viaProxy(80, async () => app.connect('198.18.61.2', 80, 'after-attempts'));
      expect(r.captured).toBe(true);
    });

    it('passing as uid/gid 1337 through a user namespace does not bypass the sidecar (the kernel sees uid 1000)', async () => {
      const r = await viaProxy(80, () => run(pod.name, ['unshare', '-U', '--map-user=1337', '--map-group=1337', PY, '-c', PY_CONNECT, '198.18.61.2', '80', '']));
      expect(r.out, 'inside the user namespace the process is uid 1337').toMatchObject({ uid: 1337, gid: 1337, data: '198.18.61.2:80|hello' });
      expect(r.captured, JSON.stringify(r.out)).toBe(true);
    });

    it('binding 127.0.0.6 (the inbound passthrough source) does not bypass the sidecar to another host', async () => {
      const r = await viaProxy(80, () => run(pod.name, [PY, '-c', PY_CONNECT, '198.18.61.2', '80', '127.0.0.6']));
      expect(r.out.uid).toBe(APP_UID);
      if (mode === 'ebpf') {
        // connect4 redirects before the route lookup: to the proxy, from 127.0.0.6
        expect(r.out.data, JSON.stringify(r.out)).toBe('198.18.61.2:80|hello');
        expect(r.captured).toBe(true);
      } else {
        // a loopback source cannot leave through eth0, and ISTIO_OUTPUT's
        // "-o lo -s 127.0.0.6 -j RETURN" does not match a packet routed to eth0
        console.log(`iptables mode, bound to 127.0.0.6: ${JSON.stringify(r.out)}`);
        expect(r.out.data === undefined || r.captured, JSON.stringify(r.out)).toBe(true);
      }
    });

    it('another port is captured too', async () => {
      const r = await viaProxy(8080, async () => app.connect('198.18.61.2', 8080, 'p8080'));
      expect(r.out.data).toBe('198.18.61.2:8080|p8080');
      expect(r.captured).toBe(true);
    });

    it('without CAP_NET_RAW a non-root app gets neither raw nor packet sockets', async () => {
      expect(await run(pod.name, [PY, '-c', PY_RAW])).toEqual({ inet_raw_tcp: 'PermissionError', packet: 'PermissionError' });
    });

    it('inherent to Istio\'s model, alike in both modes: the proxy\'s uid 1337 goes direct, and so does UDP other than DNS', async () => {
      const asProxy = await viaProxy(80, () => run(pod.name, [PY, '-c', PY_CONNECT, '198.18.61.2', '80', ''], 1337));
      expect(asProxy.out).toMatchObject({ uid: 1337, data: '198.18.61.2:80|hello' });
      expect(asProxy.captured).toBe(false);
      const udp = await app.call<{ data: string; from: string }>('udpAsk', { host: '198.18.61.2', port: 9999, payload: 'u' });
      expect(udp).toEqual({ data: '198.18.61.2:9999|u', from: '198.18.61.2:9999' });
    });
  });
}
