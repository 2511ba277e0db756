#!/usr/bin/env node
// A long-lived helper process that tests start inside a network namespace
// (ip netns exec ... [setpriv --reuid ...]) and drive over stdin/stdout with
// JSON lines {id, op, ...} -> {id, ok, result | error}. One process serves many
// connections, so tests do not pay Node's start-up per connection.
import net from 'node:net';
import dgram from 'node:dgram';
import { serveOps } from './agent-ops.mjs';

const servers = [];
const addr = (a, p) => (a && a.includes(':') ? `[${a}]:${p}` : `${a}:${p}`);

const ops = {
  // TCP server. mode tag: after the client half-closes, answer "<local>|<payload>" and close.
  // mode peer: the same with the client's address as this server saw it, "<local>|<peer>|<payload>".
  // mode echo: pipe back. mode hold: never answer (for concurrency tests).
  async listen({ host, port, mode = 'tag' }) {
    const s = net.createServer((c) => {
      if (mode === 'echo') return c.pipe(c).on('error', () => c.destroy());
      const chunks = [];
      const peer = mode === 'peer' ? `${addr(c.remoteAddress, c.remotePort)}|` : '';
      c.on('data', (d) => chunks.push(d));
      c.on('end', () => c.end(`${addr(c.localAddress, c.localPort)}|${peer}${Buffer.concat(chunks).toString('latin1')}`, 'latin1'));
      c.on('error', () => c.destroy());
    });
    servers.push(s);
    await new Promise((res, rej) => { s.once('error', rej); s.listen({ host, port, ipv6Only: host.includes(':') }, res); });
    return { port: s.address().port };
  },
  // TCP client: connect, send payload, half-close, read until the peer closes.
  async connect({ host, port, payload = '', localAddress, localPort, timeoutMs = 5000 }) {
    return new Promise((res, rej) => {
      const chunks = [];
      const c = net.connect({ host, port, ...(localAddress ? { localAddress } : {}), ...(localPort ? { localPort } : {}) }, () => c.end(payload, 'latin1'));
      const t = setTimeout(() => { c.destroy(); rej(new Error(`timeout after ${timeoutMs} ms connecting to ${addr(host, port)}`)); }, timeoutMs);
      let local = '';
      c.on('connect', () => { local = addr(c.localAddress, c.localPort); });
      c.on('data', (d) => chunks.push(d));
      c.on('close', () => { clearTimeout(t); res({ data: Buffer.concat(chunks).toString('latin1'), local }); });
      c.on('error', (e) => { clearTimeout(t); rej(e); });
    });
  },
  // One connection, `rounds` request/response exchanges of `size` bytes with an
  // echo server; every answer must equal its request.
  async pingPong({ host, port, rounds, size = 100, timeoutMs = 10000 }) {
    return new Promise((res, rej) => {
      const c = net.connect({ host, port });
      const t = setTimeout(() => { c.destroy(); rej(new Error(`ping-pong with ${addr(host, port)} stalled (timeout ${timeoutMs} ms)`)); }, timeoutMs);
      let done = 0; let got = Buffer.alloc(0); let req;
      const send = () => { req = Buffer.alloc(size, 97 + (done % 26)); c.write(req); };
      c.on('connect', send);
      c.on('data', (d) => {
        got = Buffer.concat([got, d]);
        if (got.length < size) return;
        if (got.length > size || !got.equals(req)) { clearTimeout(t); c.destroy(); return rej(new Error(`round ${done}: echo differs`)); }
        got = Buffer.alloc(0);
        if (++done === rounds) { clearTimeout(t); c.end(); return res({ rounds: done }); }
        send();
      });
      c.on('error', (e) => { clearTimeout(t); rej(e); });
    });
  },
  // Many concurrent connects; returns how many answered exactly "<expectPrefix><payload_i>".
  async connectMany({ host, port, count, payloadBytes = 1000, timeoutMs = 20000 }) {
    let ok = 0; const bad = [];
    await Promise.all(Array.from({ length: count }, (_, i) => {
      const payload = `${i}:`.padEnd(payloadBytes, String.fromCharCode(97 + (i % 26)));
      return ops.connect({ host, port, payload, timeoutMs }).then((r) => {
        if (r.data.endsWith(`|${payload}`)) ok++; else if (bad.length < 3) bad.push(r.data.slice(0, 80));
      }, (e) => { if (bad.length < 3) bad.push(e.message); });
    }));
    return { ok, bad };
  },
  async udpServe({ host, port }) {
    const u = dgram.createSocket({ type: host.includes(':') ? 'udp6' : 'udp4', ipv6Only: host.includes(':') });
    servers.push(u);
    u.on('message', (m, r) => u.send(Buffer.concat([Buffer.from(`${addr(host, port)}|`), m]), r.port, r.address));
    await new Promise((res, rej) => { u.once('error', rej); u.bind({ address: host, port }, res); });
    return {};
  },
  // One UDP query; reports who answered (the source address the app sees).
  async udpAsk({ host, port, payload, timeoutMs = 3000 }) {
    const u = dgram.createSocket(host.includes(':') ? 'udp6' : 'udp4');
    try {
      return await new Promise((res, rej) => {
        const t = setTimeout(() => rej(new Error(`no UDP answer from ${addr(host, port)} in ${timeoutMs} ms`)), timeoutMs);
        u.on('message', (m, r) => { clearTimeout(t); res({ data: m.toString('latin1'), from: addr(r.address, r.port) }); });
        u.send(Buffer.from(payload), port, host);
      });
    } finally { u.close(); }
  },
  async ping() { return { pid: process.pid, uid: process.getuid() }; },
};

serveOps(ops);
