// Issue 20: a proxy must never reorder a connection's bytes. Apps write right
// after connect() returns, before the sidecar has accepted (its backlog is
// tiny), so the first bytes of many connections sit in the accepted socket's
// TCP receive queue when the later ones are sent. The sk_msg splice (removed:
// docs/datapath.md "Why there is no splice") redirected those later bytes into
// the proxy socket's psock queue, which tcp_bpf_recvmsg serves first, and the
// proxy read them ahead of the first. This test keeps the default datapath to
// 0 reordered under that pressure.
//
// Both ends are build/bin/mc-order-check (C: node cannot open thousands of
// connections from 32 threads fast enough to fill the backlog): the app in a
// meshed pod's netns connects to 198.18.20.2:80 (exists only in the test's
// namespaces), the eBPF datapath sends it to the sidecar on 127.0.0.1:15001
// (uid 1337, listen(8)), which checks every 16-byte chunk is where it belongs.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { execa } from 'execa';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { loadDatapath, uninstallDatapath } from '../../../src/loader/datapath.js';
import { EbpfBackend } from '../../../src/pod-datapath/ebpf.js';
import { projectRoot } from '../../../src/paths.js';
import { Lab, scaled, testPinRoot } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';
import { describeEbpf } from '../../helpers/datapaths.js';

const TOOL = path.join(projectRoot, 'build/bin/mc-order-check');
/** Per configuration: 25-45 s each on the 2-core host (SYN retransmits behind the full backlog set the pace). */
const CONNS = Number(process.env.MESHCAP_ORDER_CONNS ?? 4000);
/** Deadline for a run of n connections: ≈ 130 connections/s here under backlog pressure, with room. */
const runMs = (n: number) => scaled(60_000 + n * 25);
const THREADS = 32;
const BACKLOG = 8;

interface AppResult { attempted: number; connected: number; connect_errors: number; write_errors: number; short_writes: number; first_error: string; ms: number }
interface SidecarResult { connections: number; ok: number; reordered: number; short: number; long: number; errors: number; open: number; drain_ms: number; example: { conn: number; pos: number; got: number } }

describeEbpf('byte order of app connections through the eBPF datapath (issue 20)', () => {
  const lab = new Lab();
  let pinRoot = '';
  let pods: EbpfBackend | undefined;
  let pod: { name: string; path: string };

  beforeAll(async () => {
    if (!existsSync(TOOL)) throw new Error(`${TOOL} is missing: run npm run setup`);
    pinRoot = testPinRoot();
    await loadDatapath({ pinRoot });
    pods = new EbpfBackend(pinRoot);
    pod = await lab.netns('order');
    const srv = await lab.netns('ordsrv');
    await lab.link(pod.name, srv.name, { a4: ['198.18.20.1/24'], b4: ['198.18.20.2/24'] });
    await pods.register({ netns: pod.path, config: istioCapture({ ips: ['198.18.20.1'], ipv6: false }), podIPs: ['198.18.20.1'] });
  }, scaled(120_000));

  afterAll(async () => {
    await lab.cleanup();
    pods?.close();
    if (pinRoot) uninstallDatapath(pinRoot);
  });

  /** TCP counters of the pod netns (/proc/net/snmp Tcp: and netstat TcpExt:). */
  async function tcpCounters(): Promise<Record<string, number>> {
    const out: Record<string, number> = {};
    for (const [file, prefix] of [['/proc/net/snmp', 'Tcp:'], ['/proc/net/netstat', 'TcpExt:']] as const) {
      const { stdout } = await execa('ip', ['netns', 'exec', pod.name, 'cat', file]);
      const [names, values] = stdout.split('\n').filter((l) => l.startsWith(prefix)).map((l) => l.split(/\s+/));
      names!.forEach((n, i) => i > 0 && (out[n] = Number(values![i])));
    }
    // per CPU, node-wide: the second column counts packets dropped at a full
    // input backlog (loopback's netif_rx included)
    out.softnetDropped = readFileSync('/proc/net/softnet_stat', 'utf8').trim().split('\n').reduce((n, l) => n + parseInt(l.split(/\s+/)[1]!, 16), 0);
    return out;
  }
  // Beside what the assertions use, what says whether a connection left open
  // was TCP recovering from a loss (retransmission timeouts, the loopback
  // backlog's drops: softnetDropped) rather than the datapath.
  const COUNTERS = ['OutSegs', 'OutRsts', 'RetransSegs', 'ListenOverflows', 'ListenDrops', 'SyncookiesSent', 'SyncookiesFailed', 'TCPSynRetrans', 'TCPTimeouts', 'TCPLostRetransmit', 'TCPBacklogDrop', 'TCPRcvQDrop', 'TCPAbortOnClose', 'TCPAbortOnData', 'TCPAbortOnMemory', 'TCPAbortOnTimeout', 'TCPAbortOnLinger', 'TCPAbortFailed', 'TCPChallengeACK', 'TWRecycled', 'TCPTimeWaitOverflow', 'softnetDropped'];

  async function run(sidecarArgs: string[] = [], conns = CONNS): Promise<{ app: AppResult; side: SidecarResult; tcp: Record<string, number>; ms: number }> {
    // --quiet-ms: the sidecar's 5 s of silence before it calls a connection
    // unfinished, stretched like every fixed deadline (a TCG guest under load
    // delivers a SYN-retransmitted connection's bytes later; the tool caps it at 60 s).
    const quiet = String(Math.min(scaled(5_000), 50_000));
    const side = lab.spawn(pod.name, [TOOL, 'sidecar', '--listen', '127.0.0.1:15001', '--backlog', String(BACKLOG), '--quiet-ms', quiet, ...sidecarArgs], { uid: 1337 });
    try {
      await side.ready;
      const t0 = Date.now();
      const tcp0 = await tcpCounters();
      const { stdout } = await execa('ip', ['netns', 'exec', pod.name, TOOL, 'app', '--connect', '198.18.20.2:80', '--threads', String(THREADS), '--conns', String(conns)], {
        timeout: runMs(conns),
      });
      const app = JSON.parse(stdout) as AppResult;
      // The sidecar finishes once it has read as many connections as the app
      // made (handshakes stuck behind the full backlog complete late), 60 s at most.
      side.proc.stdin!.write(`${app.connected}\n`);
      const exit = await Promise.race([side.proc, new Promise<null>((res) => setTimeout(() => res(null), scaled(75_000)))]);
      if (!exit || exit.exitCode !== 0) throw new Error(`mc-order-check sidecar did not finish: ${side.stderr()}`);
      const line = side.lines.find((l) => l.includes('"event":"summary"'));
      if (!line) throw new Error(`no summary from the sidecar: ${side.lines.join('\n')} ${side.stderr()}`);
      const tcp1 = await tcpCounters();
      const tcp = Object.fromEntries(COUNTERS.map((k) => [k, (tcp1[k] ?? 0) - (tcp0[k] ?? 0)]));
      return { app, side: JSON.parse(line) as SidecarResult, tcp, ms: Date.now() - t0 };
    } finally {
      side.proc.kill('SIGKILL');
    }
  }

  /** Every connection the app made reached the sidecar, and the method exercised the window. */
  function expectComplete(r: Awaited<ReturnType<typeof run>>) {
    const msg = JSON.stringify(r);
    // nearly all connections must get through, or the test measured little
    expect(r.app.connected, msg).toBeGreaterThanOrEqual(r.app.attempted * 0.95);
    expect(r.app.short_writes, msg).toBe(0);
    // A write can fail only on a connection the overloaded listener refused
    // (below): its reset beats the app's first write when the CPU is slow (a
    // TCG guest under load: 2 of 4,000). Any reset of an accepted connection
    // shows as the sidecar's short/errors, which must be 0.
    if (r.app.write_errors > 0) expect(r.app.first_error, msg).toBe('Connection reset by peer');
    expect(r.app.write_errors, msg).toBeLessThanOrEqual(r.tcp.SyncookiesFailed!);
    // The rest were reset by the overloaded listener itself (the late ACK's
    // SYN cookie fails: TcpExtSyncookiesFailed, one RST each; plain TCP
    // without meshcap does it too, 3-16% here depending on load): not a
    // datapath fault, but every connection must be accounted for.
    expect(r.side.connections, msg).toBeLessThanOrEqual(r.app.connected);
    expect(r.side.connections, msg).toBeGreaterThanOrEqual(r.app.connected * 0.5);
    expect(r.side.connections + r.tcp.OutRsts!, msg).toBeGreaterThanOrEqual(r.app.connected);
  }

  it(`default configuration: ${CONNS} connections written before accept arrive whole and in order`, async () => {
    const r = await run();
    console.log(`order check, default datapath: ${JSON.stringify(r)}`);
    expectComplete(r);
    expect(r.side.reordered, JSON.stringify(r.side)).toBe(0);
    expect(r.side.short + r.side.long + r.side.errors + r.side.open, JSON.stringify({ side: r.side, tcp: r.tcp })).toBe(0);
    expect(r.side.ok).toBe(r.side.connections);
  }, runMs(CONNS) + scaled(80_000));

  // The harder stress the splice failed under: SYN cookies forced in the
  // pod's netns only, and a sidecar that stops accepting for 200 ms every 250
  // connections. Plain TCP and the default datapath read 0 reordered and 0
  // reset mid-stream or unfinished here (docs/datapath.md).
  it(`SYN cookies forced and a stalled proxy: ${CONNS} connections arrive whole and in order`, async () => {
    await execa('ip', ['netns', 'exec', pod.name, 'sysctl', '-qw', 'net.ipv4.tcp_syncookies=2']);
    try {
      const r = await run(['--stall-ms', '200', '--stall-every', '250']);
      console.log(`order check, default datapath, SYN cookies forced + stalled proxy: ${JSON.stringify(r)}`);
      expectComplete(r);
      expect(r.side.reordered, JSON.stringify(r.side)).toBe(0);
      expect(r.side.short + r.side.long + r.side.errors + r.side.open, JSON.stringify({ side: r.side, tcp: r.tcp })).toBe(0);
    } finally {
      await execa('ip', ['netns', 'exec', pod.name, 'sysctl', '-qw', 'net.ipv4.tcp_syncookies=1']);
    }
  }, runMs(CONNS) + scaled(80_000));
});
