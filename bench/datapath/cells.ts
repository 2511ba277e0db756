// The cells of the datapath bench: what is measured (tests, legs, modes) and
// the lab it is measured in: one server netns (the remote service), one pod
// netns per leg and datapath kind, each with its proxy (mc-bench-echo on the
// echo leg, HAProxy on the whole path) and its capture (none, Istio's
// iptables rules, or a pod entry in meshcap's eBPF datapath). Before
// anything is timed, each cell is checked to take the path its mode names.
import { chmodSync, chownSync, mkdirSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { execa } from 'execa';
import type { Logger } from 'pino';
import type { Lab, Proc } from '../../src/lab/index.js';
import { applyCapture } from '../../src/fallback-iptables/apply.js';
import type { EbpfBackend } from '../../src/pod-datapath/ebpf.js';
import { podToCaptureConfig } from '../../src/redirect/pod.js';
import type { Leg, Mode } from './matrix.js';
import { load, tcpOutSegs, type Cpus } from './run.js';

type Kind = 'plain' | 'podsrc' | 'iptables' | 'ebpf';
const kindOf = (m: Mode): Kind => (m === 'noproxy' || m === 'direct' ? 'plain' : m);
/** The app connects to the proxy's own address (no redirect, no SO_ORIGINAL_DST): direct and podsrc. */
const toProxyItself = (m: Mode) => m === 'direct' || m === 'podsrc';

export const PROXY_UID = 1337;

interface Target {
  host: string;
  port: number;
}

export interface Pod {
  ns: string;
  svc: Target;
  proxy: Proc;
  /** HAProxy's stats socket (whole path) */
  sock?: string;
}

export interface Cell {
  leg: Leg;
  mode: Mode;
  pod: Pod;
  target: Target;
  /** TCP segments the pod netns sends per 1 B exchange (2 per hop through the TCP stack) */
  segsPerOp?: number;
}

export interface CellsSetup {
  lab: Lab;
  legs: Leg[];
  modes: Mode[];
  cpus: Cpus;
  bin: string;
  tmp: string;
  /** the eBPF datapath's pod backend, when an eBPF mode is measured */
  ebpf: EbpfBackend | null;
  log: Logger;
  /** the whole path's HAProxy in the mesh modes: SO_ORIGINAL_DST, or the service's own address as `direct`'s */
  proxyTarget: 'origdst' | 'fixed';
}

/** Makes the server, the pods and their proxies and captures; returns one cell per (leg, mode). Everything is registered in the lab. */
export async function makeCells(s: CellsSetup): Promise<Cell[]> {
  const { lab, cpus, bin } = s;
  const srv = await lab.netns('srv');
  const server = lab.start('server', srv.name, [path.join(bin, 'mc-bench-echo'), '--listen', '0.0.0.0:8080'], { cpu: cpus.server });
  await server.waitFor(/"event":"ready"/, 5000);
  mkdirSync(path.join(s.tmp, 'run'));
  chownSync(path.join(s.tmp, 'run'), PROXY_UID, PROXY_UID);
  chmodSync(s.tmp, 0o755);

  const kinds = [...new Set(s.modes.map(kindOf))];
  const pods = new Map<string, Pod>();
  let k = 0;
  for (const leg of s.legs) {
    for (const kind of kinds) {
      if (leg === 'echo' && kind === 'plain' && !s.modes.includes('direct')) continue;
      k++;
      const ns = await lab.netns(`${leg}-${kind}`);
      await lab.link(ns.name, srv.name, { a4: [`198.18.${k}.2/24`], b4: [`198.18.${k}.1/24`] });
      // Same in every pod: ports enough for the crr rounds (TIME_WAIT sockets of earlier rounds may be reused).
      await execa('ip', lab.argv(ns.name, ['sysctl', '-q', '-w', 'net.ipv4.ip_local_port_range=1024 65535', 'net.ipv4.tcp_tw_reuse=1']));

      // The echo leg's service port has no listener in the server netns: a connection that bypassed the proxy fails loudly.
      const svc = { host: `198.18.${k}.1`, port: leg === 'echo' ? 9 : 8080 };
      // The capture before the proxy starts, as in a cluster (the CNI ADD precedes the containers):
      // in eBPF mode sockops then sees the proxy's listen() (mc_listen).
      const config = istioPodConfig(`198.18.${k}.2`);
      if (kind === 'podsrc') await podSource(lab, ns.name, `198.18.${k}.2`);
      if (kind === 'iptables') await applyCapture(ns.path, config, { lockDir: path.join(s.tmp, 'xtables'), logger: s.log });
      if (kind === 'ebpf') {
        if (!s.ebpf) throw new Error('an eBPF cell without the eBPF datapath loaded');
        await s.ebpf.register({ netns: ns.path, config, podIPs: [`198.18.${k}.2`] });
      }
      let pod: Pod;
      if (leg === 'echo') {
        const proxy = lab.start(`proxy-${leg}-${kind}`, ns.name, [path.join(bin, 'mc-bench-echo'), '--listen', '0.0.0.0:15001', '--origdst'], { uid: PROXY_UID, cpu: cpus.proxy });
        await proxy.waitFor(/"event":"ready"/, 5000);
        pod = { ns: ns.name, svc, proxy };
      } else {
        const transparent = (kind === 'iptables' || kind === 'ebpf') && s.proxyTarget === 'origdst';
        const h = haproxyConfig(s.tmp, k, transparent ? '0.0.0.0:0' : `${svc.host}:${svc.port}`);
        const proxy = lab.start(`haproxy-${leg}-${kind}`, ns.name, ['haproxy', '-db', '-f', h.file], { uid: PROXY_UID, cpu: cpus.proxy });
        await waitListening(lab, ns.name, 15001, proxy);
        pod = { ns: ns.name, svc, proxy, sock: h.sock };
      }
      pods.set(`${leg}/${kind}`, pod);
      s.log.info({ event: 'pod', leg, kind, netns: ns.name, service: `${svc.host}:${svc.port}` });
    }
  }

  const cells: Cell[] = [];
  for (const leg of s.legs) {
    for (const mode of s.modes) {
      if (mode === 'noproxy' && leg === 'echo') continue; // on the echo leg the proxy is the service
      const pod = pods.get(`${leg}/${kindOf(mode)}`);
      if (!pod) throw new Error(`no pod for ${leg}/${mode}`);
      cells.push({ leg, mode, pod, target: toProxyItself(mode) ? { host: '127.0.0.1', port: 15001 } : pod.svc });
    }
  }
  return cells;
}

/**
 * podsrc: the app's connections to 127.0.0.1 leave from the pod's address,
 * as under REDIRECT or meshcap's bind, with no bind() of the app's (two
 * syscalls per connection the other modes do not make): the local route of
 * 127.0.0.1 gets the pod's address as its preferred source.
 */
async function podSource(lab: Lab, ns: string, podIP: string): Promise<void> {
  await execa('ip', lab.argv(ns, ['ip', 'route', 'replace', 'local', '127.0.0.1', 'dev', 'lo', 'table', 'local', 'proto', 'kernel', 'scope', 'host', 'src', podIP]));
  const { stdout } = await execa('ip', lab.argv(ns, ['ip', '-4', 'route', 'get', '127.0.0.1']));
  if (!stdout.includes(`src ${podIP}`)) throw new Error(`podsrc: the route to 127.0.0.1 in ${ns} does not leave from ${podIP}: ${stdout.trim()}`);
}

/** Check every cell carries traffic the way its name says; records its TCP segments per exchange. */
export async function verifyCells(cells: Cell[], lab: Lab, cpus: Cpus, bin: string, log: Logger): Promise<void> {
  for (const cell of cells) {
    const before = await proxyCount(cell);
    const r = await load(lab, bin, cpus, cell.pod.ns, cell.target, 'crr', 0.05, 0);
    const after = await proxyCount(cell);
    const through = after.accepted - before.accepted;
    const want = cell.mode === 'noproxy' ? 0 : r.connects;
    if (through !== want) throw new Error(`${cell.leg}/${cell.mode}: ${r.connects} connects, the proxy accepted ${through} (expected ${want}): the traffic does not take the path this mode names`);
    if (cell.leg === 'echo' && !toProxyItself(cell.mode) && (after.origdst ?? 0) - (before.origdst ?? 0) !== r.connects) {
      throw new Error(`${cell.leg}/${cell.mode}: SO_ORIGINAL_DST answered ${(after.origdst ?? 0) - (before.origdst ?? 0)} of ${r.connects} accepted connections`);
    }
    const segs0 = await tcpOutSegs(lab, cell.pod.ns);
    const probe = await load(lab, bin, cpus, cell.pod.ns, cell.target, 'rr1', 0.3, 0);
    cell.segsPerOp = ((await tcpOutSegs(lab, cell.pod.ns)) - segs0) / probe.ops;
    log.info({ event: 'verified', leg: cell.leg, mode: cell.mode, connects: r.connects, proxied: through, segsPerOp: Number(cell.segsPerOp.toFixed(2)) });
  }
}

/** Connections the cell's proxy accepted so far (and, for mc-bench-echo, how many got SO_ORIGINAL_DST). */
async function proxyCount(cell: Cell): Promise<{ accepted: number; origdst: number | null }> {
  if (cell.pod.sock) return { accepted: await haproxySessions(cell.pod.sock), origdst: null };
  const answer = cell.pod.proxy.nextLine(/"event":"stats"/, 5000);
  cell.pod.proxy.signal('SIGUSR1');
  const l = JSON.parse(await answer) as { accepted: number; origdst_ok: number };
  return { accepted: l.accepted, origdst: l.origdst_ok };
}

/** Wait until something accepts TCP on the port inside the netns (HAProxy prints nothing when ready). */
async function waitListening(lab: Lab, ns: string, port: number, proc: Proc): Promise<void> {
  for (let i = 0; i < 100; i++) {
    if (!proc.running) throw new Error(`${proc.name} exited before it listened: ${proc.stderr().trim() || '(no stderr)'}`);
    const { stdout } = await execa('ip', lab.argv(ns, ['ss', '-Htln', `sport = :${port}`]));
    if (stdout.trim()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`nothing listens on port ${port} in ${ns} after 5 s`);
}

function istioPodConfig(ip: string) {
  const pod = {
    apiVersion: 'v1', kind: 'Pod',
    metadata: { name: 'bench', namespace: 'bench', annotations: { 'sidecar.istio.io/status': '{"containers":["istio-proxy"]}' } },
    spec: { containers: [{ name: 'app', image: 'app' }, { name: 'istio-proxy', image: 'proxyv2' }] },
    status: { podIPs: [{ ip }] },
  };
  return podToCaptureConfig(pod, 'istio', { enableIPv6: false });
}

function haproxyConfig(tmp: string, k: number, server: string): { file: string; sock: string } {
  const sock = path.join(tmp, 'run', `haproxy-${k}.sock`);
  const file = path.join(tmp, `haproxy-${k}.cfg`);
  writeFileSync(file, [
    'global', '  nbthread 1', '  maxconn 4096', `  stats socket ${sock} mode 600 level user`,
    'defaults', '  mode tcp', '  timeout connect 5s', '  timeout client 30s', '  timeout server 30s',
    // server 0.0.0.0:0 = connect to the accepted connection's SO_ORIGINAL_DST (the mesh modes);
    // a fixed server for "direct", where the app addresses the proxy itself.
    'listen outbound', '  bind 0.0.0.0:15001', `  server upstream ${server}`, '',
  ].join('\n'));
  return { file, sock };
}

/** HAProxy's cumulative session count on the outbound frontend, from its stats socket. */
function haproxySessions(sock: string): Promise<number> {
  return new Promise((res, rej) => {
    let out = '';
    const c = net.connect({ path: sock }, () => c.end('show stat\n'));
    c.on('data', (d) => {
      out += d.toString();
    });
    c.on('error', rej);
    c.on('close', () => {
      const [hdr = '', ...rows] = out.split('\n');
      const cols = hdr.replace(/^# /, '').split(',');
      const fe = rows.map((r) => r.split(',')).find((r) => r[0] === 'outbound' && r[1] === 'FRONTEND');
      if (!fe) return rej(new Error(`no outbound FRONTEND row in HAProxy stats from ${sock}: ${out.slice(0, 200)}`));
      res(Number(fe[cols.indexOf('stot')]));
    });
  });
}
