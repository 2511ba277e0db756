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
// connections from 256 threads fast enough to fill the backlog): the app in a
// meshed pod's netns connects to 198.18.20.2:80 (exists only in the test's
// namespaces), the eBPF datapath sends it to the sidecar on 127.0.0.1:15001
// (uid 1337, listen(8)), which checks every 16-byte chunk is where it belongs.
// The app waits for each connection's end (the sidecar's EOF after it read
// the whole stream, or the listener's reset), so every connection it made is
// accounted for one by one.
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
/** Per configuration: 1-6 s each on the 2-core host (SYN retransmits behind the full backlog set the pace). */
const CONNS = Number(process.env.MESHCAP_ORDER_CONNS ?? 4000);
/** Deadline for a run of n connections: the app that did not wait for each connection's end ran ≈ 130 connections/s here, the slowest seen; a bound, not a pace. */
const runMs = (n: number) => scaled(60_000 + n * 25);
/** 256 connections in flight against a backlog of 8: as many accept-queue overflows as the app that did not wait for each connection's end made with 32 (docs/datapath.md). */
const THREADS = 256;
const BACKLOG = 8;

interface AppResult {
  attempted: number; connected: number; connect_errors: number; write_errors: number; short_writes: number;
  /** the sidecar read the connection to its end (its EOF came back) / the listener reset it / neither within --confirm-ms / anything else */
  confirmed: number; reset: number; unconfirmed: number; unexpected: number;
  first_error: string; ms: number;
}
interface SidecarResult { connections: number; ok: number; reordered: number; short: number; long: number; errors: number; open: number; open_empty: number; drain_ms: number; example: { conn: number; pos: number; got: number } }

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
      // --confirm-ms: how long a connection may take to be read to its end
      // (a handshake stuck behind the full backlog completes on retransmits)
      const { stdout } = await execa('ip', ['netns', 'exec', pod.name, TOOL, 'app', '--connect', '198.18.20.2:80', '--threads', String(THREADS), '--conns', String(conns), '--confirm-ms', String(Math.min(scaled(60_000), 600_000))], {
        timeout: runMs(conns),
      });
      const app = JSON.parse(stdout) as AppResult;
      // The sidecar finishes once it has finished as many connections as the
      // app saw confirmed (all of them by now), 60 s at most.
      side.proc.stdin!.write(`${app.confirmed}\n`);
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

  /** Every connection the app made is accounted for, and the method exercised the window. */
  function expectComplete(r: Awaited<ReturnType<typeof run>>) {
    const msg = JSON.stringify(r);
    // nearly all connections must get through, or the test measured little
    expect(r.app.connected, msg).toBeGreaterThanOrEqual(r.app.attempted * 0.95);
    expect(r.app.short_writes, msg).toBe(0);
    // The app's own accounting, connection by connection: the sidecar read
    // it to its end (its EOF came back), or the listener reset it. None may
    // be left without either: those would be bytes lost on the way.
    expect(r.app.unconfirmed, msg).toBe(0);
    expect(r.app.unexpected, msg).toBe(0);
    expect(r.app.confirmed + r.app.reset, msg).toBe(r.app.connected);
    // A reset comes only from the overloaded listener itself: a late ACK
    // whose SYN cookie fails gets one (TcpExtSyncookiesFailed; plain TCP
    // without meshcap does it too, 3-16% here depending on load), so
    // never more than those; a write can fail on it too when the CPU is
    // slow (a TCG guest under load: 2 of 4,000).
    expect(r.app.reset, msg).toBeLessThanOrEqual(r.tcp.SyncookiesFailed!);
    if (r.app.write_errors > 0) expect(r.app.first_error, msg).toBe('Connection reset by peer');
    expect(r.app.confirmed, msg).toBeGreaterThanOrEqual(r.app.connected * 0.5);
    // Every confirmed connection is one the sidecar read whole and in order.
    expect(r.side.ok, msg).toBe(r.app.confirmed);
    expect(r.side.reordered, msg).toBe(0);
    expect(r.side.short + r.side.long + r.side.errors, msg).toBe(0);
    // A socket still open at the sidecar must never have carried a byte:
    // then no app connection is behind it (each is accounted for above).
    // Seen with SYN cookies forced, 1-3 of ~3,700 once in a few runs, each
    // made by the listener from segments without data (docs/datapath.md).
    expect(r.side.open_empty, msg).toBe(r.side.open);
    if (r.side.open > 0) console.log(`order check: ${r.side.open} socket(s) the listener made that no app connection used: ${msg}`);
  }

  it(`default configuration: ${CONNS} connections written before accept arrive whole and in order`, async () => {
    const r = await run();
    console.log(`order check, default datapath: ${JSON.stringify(r)}`);
    expectComplete(r);
  }, runMs(CONNS) + scaled(80_000));

  // The harder stress the splice failed under: SYN cookies forced in the
  // pod's netns only, and a sidecar that stops accepting for 200 ms every 250
  // connections. Plain TCP and the default datapath read 0 reordered and 0
  // reset mid-stream or unconfirmed here (docs/datapath.md).
  it(`SYN cookies forced and a stalled proxy: ${CONNS} connections arrive whole and in order`, async () => {
    await execa('ip', ['netns', 'exec', pod.name, 'sysctl', '-qw', 'net.ipv4.tcp_syncookies=2']);
    try {
      const r = await run(['--stall-ms', '200', '--stall-every', '250']);
      console.log(`order check, default datapath, SYN cookies forced + stalled proxy: ${JSON.stringify(r)}`);
      expectComplete(r);
    } finally {
      await execa('ip', ['netns', 'exec', pod.name, 'sysctl', '-qw', 'net.ipv4.tcp_syncookies=1']);
    }
  }, runMs(CONNS) + scaled(80_000));
});
