// meshcap's reference sidecar: a small transparent proxy for tests, the
// sandbox and benchmarks (not a product feature). It listens where Envoy
// would (15001 outbound, 15006 inbound), recovers each connection's original
// destination with getsockopt(SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST) exactly
// as Envoy does, connects there, and pipes bytes. Run it as the proxy uid
// (1337) so the datapath leaves its own connections alone.
//
// Every accepted connection is reported as one JSON line on stdout:
//   {"event":"accept","listener":"outbound","orig":"198.18.0.2:80","peer":"127.0.0.1:40000"}
import { openSync, writeSync } from 'node:fs';
import net from 'node:net';
import dgram from 'node:dgram';
import { getOriginalDst, setTransparent } from '../native/addon.js';

export interface ProxyOptions {
  outboundPort: number;
  inboundPort: number;
  /** reply to UDP datagrams on this port (a stand-in for the DNS proxy) */
  dnsPort?: number;
  /** answer the bytes back instead of forwarding (app-to-proxy leg benchmarks) */
  echo?: boolean;
  /** source address for inbound passthrough, like Envoy's 127.0.0.6 / ::6 (on lo in IPv6 pods) */
  inboundSource4?: string;
  inboundSource6?: string;
  quiet?: boolean;
  ipv6?: boolean;
  /** IP_TRANSPARENT on the inbound listeners, as Envoy in TPROXY mode (iptables TPROXY needs it) */
  transparent?: boolean;
  /**
   * Also append every event line to this file, written (synchronously)
   * before the connection is relayed: a test that got its answer through the
   * proxy reads the file and finds the accept, with no wait on a pipe.
   */
  eventsFile?: string;
}

type Listener = 'outbound' | 'inbound';

export interface ProxyStats {
  accepted: number;
  byOrig: Record<string, number>;
  errors: number;
}

function fmt(family: 4 | 6, address: string, port: number) {
  return family === 6 ? `[${address}]:${port}` : `${address}:${port}`;
}

export function startReferenceProxy(o: ProxyOptions): { stats: ProxyStats; ready: Promise<void>; close(): void } {
  const stats: ProxyStats = { accepted: 0, byOrig: {}, errors: 0 };
  const servers: (net.Server | dgram.Socket)[] = [];
  const eventsFd = o.eventsFile ? openSync(o.eventsFile, 'a') : undefined;
  const emit = (e: object) => {
    const line = JSON.stringify(e) + '\n';
    if (eventsFd !== undefined) writeSync(eventsFd, line);
    if (!o.quiet) process.stdout.write(line);
  };

  const onConn = (listener: Listener, family: 4 | 6, port: number) => (sock: net.Socket) => {
    const fd = (sock as unknown as { _handle?: { fd?: number } })._handle?.fd;
    let orig;
    try {
      if (fd === undefined || fd < 0) throw new Error('no fd on accepted socket');
      orig = getOriginalDst(fd, family === 4 ? 'ipv4' : 'ipv6');
    } catch (e) {
      stats.errors++;
      emit({ event: 'error', listener, peer: `${sock.remoteAddress}:${sock.remotePort}`, error: (e as Error).message });
      sock.destroy();
      return;
    }
    const key = fmt(orig.family, orig.address, orig.port);
    stats.accepted++;
    stats.byOrig[key] = (stats.byOrig[key] ?? 0) + 1;
    emit({ event: 'accept', listener, orig: key, local: fmt(sock.localFamily === 'IPv6' ? 6 : 4, sock.localAddress ?? '', sock.localPort ?? 0), peer: `${sock.remoteAddress}:${sock.remotePort}`, raw: orig.raw.toString('hex'), optlen: orig.optlen });
    sock.setNoDelay(true);
    // A connection made straight to this listener (not redirected) reports
    // the listener itself (its port, our own address) as its original
    // destination where conntrack tracks it (iptables mode): forwarding it
    // would connect to ourselves again and again. Envoy closes such loops
    // too. (eBPF inbound keeps the original destination as the local
    // address, on the app's port: not this.)
    const local = (sock.localAddress ?? '').replace(/^::ffff:/, '');
    if (orig.port === port && sock.localPort === port && orig.address.replace(/^::ffff:/, '') === local) {
      emit({ event: 'loop', listener, orig: key });
      sock.destroy();
      return;
    }
    if (o.echo) {
      sock.pipe(sock);
      sock.on('error', () => sock.destroy());
      return;
    }
    const localAddress = listener === 'inbound' ? (orig.family === 4 ? o.inboundSource4 ?? '127.0.0.6' : o.inboundSource6 ?? '::6') : undefined;
    const up = net.connect({ host: orig.address, port: orig.port, family: orig.family, allowHalfOpen: true, ...(localAddress ? { localAddress } : {}) });
    up.setNoDelay(true);
    sock.pipe(up).pipe(sock);
    const kill = () => {
      sock.destroy();
      up.destroy();
    };
    up.on('error', (e) => {
      stats.errors++;
      emit({ event: 'upstream-error', listener, orig: key, error: e.message });
      kill();
    });
    sock.on('error', kill);
  };

  const listen = (port: number, listener: Listener) => {
    const fams: (4 | 6)[] = o.ipv6 === false ? [4] : [4, 6];
    return fams.map(
      (family) =>
        new Promise<void>((resolve, reject) => {
          const s = net.createServer({ noDelay: true, allowHalfOpen: true }, onConn(listener, family, port));
          servers.push(s);
          s.once('error', reject);
          s.listen({ host: family === 4 ? '0.0.0.0' : '::', port, ipv6Only: family === 6, backlog: 4096 }, () => {
            if (o.transparent && listener === 'inbound') {
              const fd = (s as unknown as { _handle?: { fd?: number } })._handle?.fd;
              if (fd === undefined) return reject(new Error('no fd on the inbound listener'));
              setTransparent(fd, family === 4 ? 'ipv4' : 'ipv6');
            }
            resolve();
          });
        }),
    );
  };

  const waits = [...listen(o.outboundPort, 'outbound'), ...listen(o.inboundPort, 'inbound')];
  if (o.dnsPort) {
    for (const type of ['udp4', 'udp6'] as const) {
      if (type === 'udp6' && o.ipv6 === false) continue;
      const u = dgram.createSocket({ type, ipv6Only: type === 'udp6' });
      servers.push(u);
      u.on('message', (msg, rinfo) => {
        emit({ event: 'dns', from: `${rinfo.address}:${rinfo.port}`, bytes: msg.length });
        u.send(msg, rinfo.port, rinfo.address);
      });
      waits.push(new Promise((resolve, reject) => {
        u.once('error', reject);
        // loopback only, as istio-agent's DNS proxy: a reply must come from the
        // address the REDIRECT sent the query to, or conntrack cannot undo it
        u.bind({ port: o.dnsPort!, address: type === 'udp4' ? '127.0.0.1' : '::1' }, () => resolve());
      }));
    }
  }
  return {
    stats,
    ready: Promise.all(waits).then(() => undefined),
    close: () => {
      for (const s of servers) (s as { close(): void }).close();
    },
  };
}
