#!/usr/bin/env node
// The fates test's client and listeners inside a pod or world netns, driven
// over stdin/stdout JSON lines like test/helpers/ns-agent.mjs. Unlike that
// agent, `connect` always answers (never rejects) and reports the socket's
// local address even when the connection fails after it was made, so the
// test can attribute each proxy accept (whose peer is that address) to the
// connection that caused it.
import net from 'node:net';
import { serveOps } from '../agent-ops.mjs';

const servers = [];
const plain = (a) => (a ?? '').replace(/^::ffff:/, '');
const addr = (a, p) => (plain(a).includes(':') ? `[${plain(a)}]:${p}` : `${plain(a)}:${p}`);

const ops = {
  // Answers "<local address>|<peer address>|<payload>" once the client
  // half-closes: who answered, and whether the client itself connected (a
  // proxied connection arrives from the proxy's socket).
  async listen({ host, port }) {
    const s = net.createServer((c) => {
      const chunks = [];
      c.on('data', (d) => chunks.push(d));
      c.on('end', () => c.end(`${addr(c.localAddress, c.localPort)}|${plain(c.remoteAddress)}:${c.remotePort}|${Buffer.concat(chunks).toString('latin1')}`, 'latin1'));
      c.on('error', () => c.destroy());
    });
    servers.push(s);
    await new Promise((res, rej) => { s.once('error', rej); s.listen({ host, port, ipv6Only: host.includes(':') }, res); });
    return {};
  },
  // One connection: {data, local} when it completes, {error, local?} otherwise.
  async connect({ host, port, payload = '', localAddress, localPort, timeoutMs = 3000 }) {
    return new Promise((res) => {
      const chunks = [];
      let local;
      let done = false;
      const finish = (r) => { if (!done) { done = true; clearTimeout(t); c.destroy(); res({ ...r, ...(local ? { local } : {}) }); } };
      const c = net.connect({ host, port, ...(localAddress ? { localAddress } : {}), ...(localPort ? { localPort } : {}) }, () => {
        local = `${plain(c.localAddress)}:${c.localPort}`;
        c.end(payload, 'latin1');
      });
      const t = setTimeout(() => finish({ error: 'ETIMEDOUT' }), timeoutMs);
      c.on('data', (d) => chunks.push(d));
      c.on('close', () => finish({ data: Buffer.concat(chunks).toString('latin1') }));
      c.on('error', (e) => finish({ error: e.code ?? e.message }));
    });
  },
};

serveOps(ops);
