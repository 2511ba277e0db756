// Issue 20: a proxy must never reorder a connection's bytes. Apps write right
// after connect() returns, before the sidecar has accepted (its backlog is
// tiny), so the first bytes of many connections sit in the accepted socket's
// TCP receive queue when the later ones are sent. With the sk_msg splice on,
// those later bytes were redirected into the proxy socket's psock queue,
// which tcp_bpf_recvmsg serves first: the proxy read them ahead of the first.
//
// Both ends are build/bin/mc-order-check (C: node cannot open thousands of
// connections from 32 threads fast enough to fill the backlog): the app in a
// meshed pod's netns connects to 198.18.20.2:80 (exists only in the test's
// namespaces), the eBPF datapath sends it to the sidecar on 127.0.0.1:15001
// (uid 1337, listen(8)), which checks every 16-byte chunk is where it belongs.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { execa } from 'execa';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadDatapath, setSplice, spliceOn, uninstallDatapath } from '../../../src/loader/datapath.js';
import { EbpfBackend } from '../../../src/pod-datapath/ebpf.js';
import { projectRoot } from '../../../src/paths.js';
import { Lab, scaled, testPinRoot } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';
import { describeEbpf } from '../../helpers/datapaths.js';

const TOOL = path.join(projectRoot, 'build/bin/mc-order-check');
const FIONREAD_SCRIPT = fileURLToPath(new URL('./splice_fionread.py', import.meta.url));
/** Per configuration: 25-45 s each on the 2-core host (SYN retransmits behind the full backlog set the pace). */
const CONNS = Number(process.env.MESHCAP_ORDER_CONNS ?? 4000);
/** For the splice cases alone (the 100,000-connection proof: docs/datapath.md). */
const SPLICE_CONNS = Number(process.env.MESHCAP_ORDER_SPLICE_CONNS ?? CONNS);
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
    // No splice option: what `meshcap load` / `meshcap agent` do by default.
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
    return out;
  }
  const COUNTERS = ['OutSegs', 'OutRsts', 'ListenOverflows', 'SyncookiesSent', 'SyncookiesFailed', 'TCPSynRetrans', 'TCPAbortOnClose', 'TCPAbortOnData', 'TCPAbortOnMemory', 'TCPAbortOnTimeout', 'TCPAbortOnLinger', 'TCPAbortFailed', 'TCPChallengeACK', 'TWRecycled', 'TCPTimeWaitOverflow'];

  async function run(sidecarArgs: string[] = [], conns = CONNS): Promise<{ app: AppResult; side: SidecarResult; tcp: Record<string, number>; ms: number }> {
    const side = lab.spawn(pod.name, [TOOL, 'sidecar', '--listen', '127.0.0.1:15001', '--backlog', String(BACKLOG), ...sidecarArgs], { uid: 1337 });
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
    expect(r.app.write_errors + r.app.short_writes, msg).toBe(0);
    // The rest were reset by the overloaded listener itself (the late ACK's
    // SYN cookie fails: TcpExtSyncookiesFailed, one RST each; plain TCP
    // without meshcap does it too, 3-16% here depending on load): not a
    // datapath fault, but every connection must be accounted for.
    expect(r.side.connections, msg).toBeLessThanOrEqual(r.app.connected);
    expect(r.side.connections, msg).toBeGreaterThanOrEqual(r.app.connected * 0.5);
    expect(r.side.connections + r.tcp.OutRsts!, msg).toBeGreaterThanOrEqual(r.app.connected);
  }

  let spliceDefault: boolean | undefined;

  it('the loader leaves the splice off when not asked (experimental: issue 20, docs/datapath.md)', () => {
    spliceDefault = spliceOn(pinRoot);
    expect(spliceDefault).toBe(false);
  });

  it(`default configuration: ${CONNS} connections written before accept arrive whole and in order`, async () => {
    expect(spliceOn(pinRoot)).toBe(false);
    const r = await run();
    console.log(`order check, default (splice off): ${JSON.stringify(r)}`);
    expectComplete(r);
    expect(r.side.reordered, JSON.stringify(r.side)).toBe(0);
    expect(r.side.short + r.side.long + r.side.errors + r.side.open, JSON.stringify(r.side)).toBe(0);
    expect(r.side.ok).toBe(r.side.connections);
    offSegsPerConn = r.tcp.OutSegs! / r.side.connections;
  }, runMs(CONNS) + scaled(80_000));

  /** TCP segments the pod sent per connection read, splice off: the yardstick for "the splice carried the bytes". */
  let offSegsPerConn: number | undefined;

  /** Run with the splice on, a tcp_syncookies mode in the pod's netns only, and sidecar options. */
  async function runSpliced(syncookies: 1 | 2, sidecarArgs: string[]) {
    await execa('ip', ['netns', 'exec', pod.name, 'sysctl', '-qw', `net.ipv4.tcp_syncookies=${syncookies}`]);
    setSplice(pinRoot, true);
    try {
      return await run(sidecarArgs, SPLICE_CONNS);
    } finally {
      setSplice(pinRoot, false);
      await execa('ip', ['netns', 'exec', pod.name, 'sysctl', '-qw', 'net.ipv4.tcp_syncookies=1']);
    }
  }

  // Each must hold with the splice on since mc_splice_msg redirects only what
  // cannot overtake bytes on the TCP path (issue 20); before that fix the
  // first case found 59-183 reordered connections per run.
  const SPLICE_CASES: { name: string; syncookies: 1 | 2; args: string[] }[] = [
    { name: 'backlog 8', syncookies: 1, args: [] },
    { name: 'backlog 8, SYN cookies forced (tcp_syncookies=2)', syncookies: 2, args: [] },
    { name: 'backlog 8, stalled proxy (no accept for 200 ms every 250)', syncookies: 2, args: ['--stall-ms', '200', '--stall-every', '250'] },
  ];
  for (const c of SPLICE_CASES) {
    it(`splice on, ${c.name}: ${SPLICE_CONNS} connections arrive whole and in order, mostly spliced`, async () => {
      expect(offSegsPerConn, 'the default configuration did not run first').toBeDefined();
      const on = await runSpliced(c.syncookies, c.args);
      console.log(`order check, splice on, ${c.name}: ${JSON.stringify(on)}`);
      expectComplete(on);
      expect(on.side.reordered, JSON.stringify(on.side)).toBe(0);
      expect(on.side.short + on.side.long, JSON.stringify(on.side)).toBe(0);
      // Known defect, not yet understood (docs/datapath.md): under a stalled
      // proxy a few spliced connections are reset mid-stream (their bytes up
      // to the reset in order) or do not finish; plain TCP under the same
      // stress has none. While it happens the splice must not be the default.
      expect(spliceDefault, 'the default was not read').toBeDefined();
      expect(
        on.side.errors + on.side.open === 0 || spliceDefault === false,
        `${on.side.errors} connections reset and ${on.side.open} unfinished with the splice on, yet it is on by default`,
      ).toBe(true);
      // A clean run proves something only if the splice carried the bytes:
      // then the pod's TCP sent far fewer segments than without it.
      const perConn = on.tcp.OutSegs! / on.side.connections;
      expect(perConn, `TCP segments per connection with the splice on: ${perConn.toFixed(1)}, off: ${offSegsPerConn!.toFixed(1)}`).toBeLessThan(offSegsPerConn! * 0.5);
    }, runMs(SPLICE_CONNS) + scaled(80_000));
  }


  /** The n-th JSON line with this event from a spawned helper (bounded wait). */
  async function event<T = Record<string, unknown>>(p: { lines: string[]; stderr: () => string }, name: string, nth = 1): Promise<T> {
    for (let i = 0; i < scaled(100); i++) {
      const hits = p.lines.map((l) => { try { return JSON.parse(l) as { event?: string }; } catch { return {}; } }).filter((m) => m.event === name);
      if (hits.length >= nth) return hits[nth - 1] as T;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`no ${name} event #${nth}: ${p.lines.join(' ')} ${p.stderr()}`);
  }

  // A proxy that stops reading must not make the splice queue without bound:
  // past the proxy's receive buffer, TCP (and its window) carries the rest,
  // which is order-safe because the psock queue is read first.
  it('splice on, a proxy that does not read: the psock queue stops at the receive buffer, TCP carries the rest, all in order; FIONREAD', async () => {
    const rmem = Number((await execa('ip', ['netns', 'exec', pod.name, 'sysctl', '-n', 'net.ipv4.tcp_rmem'])).stdout.trim().split(/\s+/)[1]);
    setSplice(pinRoot, true);
    const proxy = lab.spawn(pod.name, ['/usr/bin/python3', FIONREAD_SCRIPT, 'proxy'], { uid: 1337, until: /"ready"/ });
    try {
      await proxy.ready;
      const app = lab.spawn(pod.name, ['/usr/bin/python3', FIONREAD_SCRIPT, 'app', '198.18.20.2', '80'], { until: /"connected"/ });
      await app.ready;
      await event(proxy, 'accepted');
      const settle = () => new Promise((r) => setTimeout(r, 300));
      const inq = async (nth: number) => {
        proxy.proc.stdin!.write('inq\n');
        return (await event<{ bytes: number }>(proxy, 'inq', nth)).bytes;
      };
      // 1. a small write: spliced whole, FIONREAD counts it
      app.proc.stdin!.write('4096\n');
      expect((await event<{ total: number }>(app, 'sent', 1)).total).toBe(4096);
      await settle();
      expect(await inq(1), 'FIONREAD after 4096 spliced bytes').toBe(4096);
      // 2. past the receive buffer: the psock queue stops there, TCP takes the rest
      app.proc.stdin!.write(`${rmem + 32768 - 4096}\n`);
      const total = (await event<{ total: number }>(app, 'sent', 2)).total;
      await settle();
      const { stdout: ss } = await execa('ip', ['netns', 'exec', pod.name, 'ss', '-tniH', 'state', 'established', 'sport', '= :15001']);
      const viaTcp = Number(/bytes_received:(\d+)/.exec(ss)?.[1] ?? 0);
      const fionread = await inq(2);
      app.proc.stdin!.write('close\n');
      proxy.proc.stdin!.write('read\n');
      const read = await event<{ bytes: number; in_order: boolean }>(proxy, 'read');
      console.log(`splice backpressure: rcvbuf ${rmem}, app wrote ${total}, ${viaTcp} through TCP, FIONREAD ${fionread}, proxy read ${read.bytes} in order: ${read.in_order}`);
      expect(read).toEqual({ event: 'read', bytes: total, in_order: true });
      expect(total).toBeGreaterThan(rmem);
      // the psock queue was bounded: at least what exceeded the buffer went through TCP
      expect(viaTcp).toBeGreaterThanOrEqual(total - rmem);
      expect(viaTcp).toBeLessThan(total);
      // FIONREAD with bytes in both queues: this kernel's tcp_bpf_ioctl counts
      // one of them only, so while it is wrong the splice must stay off by default.
      expect(spliceDefault, 'the default was not read').toBeDefined();
      expect(fionread === total || spliceDefault === false, `FIONREAD ${fionread} of ${total} queued, yet the splice is on by default`).toBe(true);
    } finally {
      setSplice(pinRoot, false);
      proxy.proc.kill('SIGKILL');
    }
  }, scaled(60_000));

});
