// How much of a Node net connection reaches V8's old space: a plain Node
// server on a unix socket (no meshcap code), V8 flags as the agent runs
// (--max-semi-space-size=1 --optimize-for-size), 16 clients connecting in a
// loop for a few seconds; old space's growth per scavenge read from
// --trace-gc-verbose. Servers: `answer` answers each request (as the
// agent's CNI server did on node's net), `destroy` destroys each socket on
// accept, and `meshcap` is the agent's own CNI server (startCniServer, on the
// addon's listener thread) with DEL-sized requests and handlers that do
// nothing, from this checkout's dist/ or another build's (--dist DIR, e.g. a
// worktree of an older commit, built). docs/bench-scale.md, "Where a drain's
// peak comes from" and "The drain's peak, taken apart".
//
//   node bench/scale/node-net-promotion.mjs [seconds] [answer,destroy,meshcap] [--dist DIR]
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

const args = process.argv.slice(2);
const distAt = args.indexOf('--dist');
const DIST = path.resolve(distAt >= 0 ? args.splice(distAt, 2)[1] : new URL('../../dist', import.meta.url).pathname);
const SECONDS = Number(args[0] ?? 5);
const MODES = (args[1] ?? 'answer,destroy').split(',');
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

// The agent's server as the agent starts it, its logger silenced; run from
// the dist dir so that its imports (pino, the addon) resolve as they do there.
const MESHCAP_SERVER = `
const [sockPath, dist] = process.argv.slice(1);
(async () => {
  const { startCniServer } = await import(dist + '/cni/server.js');
  const pino = (await import(require.resolve('pino', { paths: [dist] }))).default;
  const noop = async () => {};
  await startCniServer({
    socketPath: sockPath, logger: pino({ level: 'silent' }),
    handlers: { add: noop, del: async () => ({}), check: noop, status: noop, gc: noop },
    identity: () => ({ mode: 'ebpf', startedAt: new Date(0).toISOString(), notReady: null, podSourceSynced: true, pid: process.pid }),
  });
  console.log('ready');
})();
process.on('SIGTERM', () => process.exit(0));
`;

async function run(mode) {
  const sockPath = path.join(dir, `${mode}.sock`);
  const script = mode === 'meshcap' ? [MESHCAP_SERVER, sockPath, DIST] : [SERVER, sockPath, mode];
  const srv = spawn(process.execPath, ['--max-semi-space-size=1', '--optimize-for-size', '--trace-gc', '--trace-gc-verbose', '-e', ...script], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  srv.stdout.on('data', (d) => (out += d));
  await new Promise((resolve) => { const t = setInterval(() => { if (out.includes('ready')) { clearInterval(t); resolve(); } }, 20); });
  const payload = JSON.stringify({ pad: 'y'.repeat(2000) });
  // a DEL as the forwarder sends it (protocol v1), ~2 KB like the others
  const stdin = JSON.stringify({ cniVersion: '1.0.0', name: 'k8s-pod-network', type: 'meshcap-cni', pad: 'y'.repeat(1500) });
  const request = (id) => (mode === 'meshcap'
    ? JSON.stringify({ v: 1, command: 'DEL', containerId: `c${id}`, netns: '', ifname: 'eth0', args: `K8S_POD_NAMESPACE=default;K8S_POD_NAME=p${id}`, path: '/opt/cni/bin', stdin })
    : JSON.stringify({ id, p: payload }));
  const end = Date.now() + SECONDS * 1000;
  let n = 0;
  await Promise.all(Array.from({ length: 16 }, () => new Promise((resolve) => {
    const one = () => {
      if (Date.now() > end) return resolve();
      const c = net.connect({ path: sockPath, allowHalfOpen: true }, () => c.end(request(n++)));
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
  for (const mode of MODES) console.log(JSON.stringify({ ...(await run(mode)), ...(mode === 'meshcap' ? { dist: DIST } : {}) }));
} finally {
  rmSync(dir, { recursive: true, force: true });
}
