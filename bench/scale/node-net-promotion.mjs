// How much of a Node net connection reaches V8's old space: a plain Node
// server on a unix socket (no meshcap code), V8 flags as the agent runs
// (--max-semi-space-size=1 --optimize-for-size), 16 clients connecting in a
// loop for a few seconds; old space's growth per scavenge read from
// --trace-gc-verbose. Two servers: one that answers each request (as the
// agent's CNI server does) and one that destroys each socket on accept.
// docs/bench-scale.md, "Where a drain's peak comes from".
//
//   node bench/scale/node-net-promotion.mjs [seconds]
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

const SECONDS = Number(process.argv[2] ?? 5);
const dir = mkdtempSync(path.join(os.tmpdir(), 'meshcap-net-promotion-'));

const SERVER = `
const net = require('net');
const [sockPath, mode] = process.argv.slice(1);
const server = net.createServer({ allowHalfOpen: true }, (sock) => {
  if (mode === 'destroy') return sock.destroy();
  const chunks = [];
  sock.on('data', (c) => chunks.push(c));
  sock.on('end', () => {
    const req = JSON.parse(Buffer.concat(chunks).toString());
    setImmediate(() => sock.end(JSON.stringify({ ok: true, id: req.id })));
  });
});
server.listen(sockPath, () => console.log('ready'));
process.on('SIGTERM', () => process.exit(0));
`;

async function run(mode) {
  const sockPath = path.join(dir, `${mode}.sock`);
  const srv = spawn(process.execPath, ['--max-semi-space-size=1', '--optimize-for-size', '--trace-gc', '--trace-gc-verbose', '-e', SERVER, sockPath, mode], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  srv.stdout.on('data', (d) => (out += d));
  await new Promise((resolve) => { const t = setInterval(() => { if (out.includes('ready')) { clearInterval(t); resolve(); } }, 20); });
  const payload = JSON.stringify({ pad: 'y'.repeat(2000) });
  const end = Date.now() + SECONDS * 1000;
  let n = 0;
  await Promise.all(Array.from({ length: 16 }, () => new Promise((resolve) => {
    const one = () => {
      if (Date.now() > end) return resolve();
      const c = net.connect(sockPath, () => c.end(JSON.stringify({ id: n++, p: payload })));
      c.on('data', () => undefined);
      c.on('error', () => undefined);
      c.on('close', () => setImmediate(one));
    };
    one();
  })));
  srv.kill('SIGTERM');
  await new Promise((r) => srv.once('exit', r));
  // old space after each GC; growth summed over scavenges that follow a scavenge
  let typ = '', old = 0, prev = 0, grown = 0, scavenges = 0, majors = 0;
  for (const line of out.split('\n')) {
    const g = / ms: (Scavenge|Mark-Compact)/.exec(line);
    if (g) { typ = g[1]; continue; }
    const o = /Old space,\s+used:\s+(\d+) KB/.exec(line);
    if (o) old = Number(o[1]);
    if (!line.includes('Total time spent in GC')) continue;
    if (typ === 'Scavenge') {
      if (prev) { grown += old - prev; scavenges++; }
      prev = old;
    } else { majors++; prev = 0; }
  }
  return { mode, connections: n, scavenges, majors, oldKiBPerScavenge: Math.round(grown / Math.max(scavenges, 1)), promotedBytesPerConnection: Math.round((grown * 1024) / Math.max(n, 1)) };
}

try {
  for (const mode of ['answer', 'destroy']) console.log(JSON.stringify(await run(mode)));
} finally {
  rmSync(dir, { recursive: true, force: true });
}
