// startCniServer's socket lifecycle and wire handling, driven by a raw
// unix-socket client (what a foreign or broken forwarder could send).
import { execa } from 'execa';
import { existsSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { startCniServer, type CniServer } from '../../../src/cni/server.js';
import type { CniHandlers } from '../../../src/cni/types.js';
import { queryAgentVersion } from '../../../src/cni/agent-query.js';
import { CniError } from '../../../src/cni/errors.js';
import { CniEventKind, cniListen } from '../../../src/native/addon.js';
import { meshcapVersion } from '../../../src/version.js';

const logger = pino({ level: 'silent' });
const noop = async () => {};
const handlers: CniHandlers = { add: noop, del: noop, check: noop, status: noop, gc: noop };

let dir: string;
const servers: CniServer[] = [];

beforeEach(() => {
  dir = mkdtempSync(path.join(tmpdir(), 'meshcap-cnisrv-'));
});
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close().catch(() => {});
  rmSync(dir, { recursive: true, force: true });
});

async function start(socketPath: string, extra: { requestReadTimeoutMs?: number } = {}): Promise<CniServer> {
  const s = await startCniServer({ socketPath, handlers, logger, ...extra });
  servers.push(s);
  return s;
}

/** Sends bytes, optionally half-closes, returns everything the server answers before closing. */
function exchange(socketPath: string, payload: Buffer | string, halfClose = true): Promise<string> {
  return new Promise((resolve, reject) => {
    const c = net.connect({ path: socketPath, allowHalfOpen: true });
    const chunks: Buffer[] = [];
    c.on('data', (d: Buffer) => chunks.push(d));
    c.on('end', () => {
      c.end();
      resolve(Buffer.concat(chunks).toString());
    });
    c.on('error', reject);
    c.write(payload, () => {
      if (halfClose) c.end();
    });
  });
}

/** Waits for ok() (polled every 5 ms), failing after 5 s. */
async function until(ok: () => boolean): Promise<void> {
  const t0 = performance.now();
  while (!ok()) {
    if (performance.now() - t0 > 5000) throw new Error('not within 5 s');
    await new Promise((r) => setTimeout(r, 5));
  }
}

const request = (over: Record<string, unknown> = {}) =>
  JSON.stringify({
    v: 1, command: 'ADD', containerId: 'c1', netns: '/var/run/netns/x', ifname: 'eth0', args: '', path: '',
    stdin: JSON.stringify({ cniVersion: '1.0.0', name: 'n', type: 'meshcap-cni' }), ...over,
  });

describe('socket lifecycle', () => {
  it('creates the parent dir 0700 and the socket 0600, and answers', async () => {
    const sock = path.join(dir, 'a', 'b', 'cni.sock');
    const s = await start(sock);
    expect(s.address).toBe(sock);
    expect(statSync(path.join(dir, 'a', 'b')).mode & 0o777).toBe(0o700);
    expect(statSync(sock).mode & 0o777).toBe(0o600);
    expect(statSync(sock).isSocket()).toBe(true);
    expect(JSON.parse(await exchange(sock, request()))).toEqual({ exitCode: 0, stdout: '{"cniVersion":"1.0.0"}', agent: expect.any(Object) });
  });

  it('every reply names the agent\'s version (a field the forwarder ignores); meshcap version asks with VERSION', async () => {
    const sock = path.join(dir, 'cni.sock');
    await start(sock);
    const { version, commit, dirty } = meshcapVersion();
    const d = dirty ? { dirty } : {};
    expect(JSON.parse(await exchange(sock, request())).agent).toEqual({ version, commit, ...d });
    const a = await queryAgentVersion(sock);
    expect(a).toEqual({ reachable: true, version, commit, ...d, cniVersions: ['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'] });
    expect(await queryAgentVersion(path.join(dir, 'none.sock'))).toEqual({ reachable: false, error: 'no socket there (is the agent running?)' });
  });

  it('replaces a stale socket left by a dead agent', async () => {
    const sock = path.join(dir, 'cni.sock');
    await execa('python3', ['-c', `import socket; s=socket.socket(socket.AF_UNIX); s.bind(${JSON.stringify(sock)})`]);
    expect(statSync(sock).isSocket()).toBe(true);
    await start(sock);
    expect(JSON.parse(await exchange(sock, request()))).toMatchObject({ exitCode: 0 });
  });

  it('refuses a socket another process serves, and a non-socket file', async () => {
    const sock = path.join(dir, 'cni.sock');
    await start(sock);
    await expect(startCniServer({ socketPath: sock, handlers, logger })).rejects.toThrow(/already served by another process/);
    const file = path.join(dir, 'file');
    writeFileSync(file, 'keep me');
    await expect(startCniServer({ socketPath: file, handlers, logger })).rejects.toThrow(/is not a socket/);
    expect(existsSync(file)).toBe(true);
  });

  it('close() removes its socket and cuts in-flight requests', async () => {
    const sock = path.join(dir, 'cni.sock');
    let entered!: () => void;
    const inHandler = new Promise<void>((r) => (entered = r));
    const s = await startCniServer({ socketPath: sock, handlers: { ...handlers, add: () => (entered(), new Promise(() => {})) }, logger });
    const pending = exchange(sock, request());
    await inHandler;
    await s.close();
    // The forwarder sees a close without an answer: "unreachable", ADD -> 11.
    expect(await pending).toBe('');
    expect(existsSync(sock)).toBe(false);
    await start(sock);
    expect(JSON.parse(await exchange(sock, request()))).toMatchObject({ exitCode: 0 });
  });
});

describe('wire handling', () => {
  it('rejects a foreign wire version with code 6 and a hint', async () => {
    const sock = path.join(dir, 'cni.sock');
    await start(sock);
    const r = JSON.parse(await exchange(sock, request({ v: 2 }))) as { exitCode: number; stdout: string };
    expect(r.exitCode).toBe(1);
    expect(JSON.parse(r.stdout)).toMatchObject({ code: 6 });
    expect(r.stdout).toMatch(/wire protocol 2/);
    const junk = JSON.parse(await exchange(sock, 'not json')) as { stdout: string };
    expect(JSON.parse(junk.stdout)).toMatchObject({ code: 6 });
  });

  it('rejects a request over the cap with code 7, and keeps serving', async () => {
    const sock = path.join(dir, 'cni.sock');
    await start(sock);
    const r = JSON.parse(await exchange(sock, Buffer.alloc(5 << 20, 0x20))) as { stdout: string };
    expect(JSON.parse(r.stdout)).toMatchObject({ code: 7 });
    expect(JSON.parse(await exchange(sock, request()))).toMatchObject({ exitCode: 0 });
  });

  it('serves a request that arrived in time although the loop was held past the deadline', async () => {
    // The client is another process: it connects (the deadline starts), then
    // sends while this process's event loop is blocked longer than the deadline.
    const sock = path.join(dir, 'cni.sock');
    await start(sock, { requestReadTimeoutMs: 300 });
    const client = execa(process.execPath, ['-e', `
      const c = require('node:net').connect({ path: process.argv[1], allowHalfOpen: true });
      const chunks = [];
      c.on('connect', () => process.stdout.write('connected\\n'));
      c.on('data', (d) => chunks.push(d));
      c.on('end', () => process.stdout.write(Buffer.concat(chunks), () => process.exit(0)));
      process.stdin.once('data', () => c.end(process.argv[2]));
    `, sock, request()], { stdin: 'pipe' });
    await new Promise<void>((resolve, reject) => {
      client.stdout!.on('data', (d: Buffer) => { if (d.toString().includes('connected')) resolve(); });
      client.catch(reject);
    });
    await new Promise((r) => setTimeout(r, 50)); // the server has accepted: its deadline runs
    client.stdin!.write('go\n');
    const until = performance.now() + 900;
    while (performance.now() < until) { /* the agent's loop held (a long pass, GC, a starved CPU) */ }
    const { stdout } = await client;
    // the timeout's answer would be code 5 ("not complete within 300 ms")
    const reply = JSON.parse(stdout.slice(stdout.indexOf('{'))) as { exitCode: number };
    expect(reply).toMatchObject({ exitCode: 0, stdout: '{"cniVersion":"1.0.0"}' });
  });

  it('answers code 5 when a client never finishes its request', async () => {
    const sock = path.join(dir, 'cni.sock');
    await start(sock, { requestReadTimeoutMs: 200 });
    const t0 = performance.now();
    const r = JSON.parse(await exchange(sock, '{"v":1', false)) as { stdout: string };
    expect(JSON.parse(r.stdout)).toMatchObject({ code: 5 });
    expect(performance.now() - t0).toBeLessThan(2000);
  });

  it('answers 200 clients at once, each with its own answer', async () => {
    // Each ADD fails with the container id in its message: an answer that
    // went to the wrong connection shows.
    const sock = path.join(dir, 'cni.sock');
    const s = await startCniServer({
      socketPath: sock, logger,
      handlers: { ...handlers, add: async (req) => { await new Promise((r) => setTimeout(r, Math.random() * 20)); throw new CniError(7, `for ${req.containerId}`); } },
    });
    servers.push(s);
    const ids = Array.from({ length: 200 }, (_, i) => `c${i}`);
    const replies = await Promise.all(ids.map((id) => exchange(sock, request({ containerId: id }))));
    replies.forEach((r, i) => {
      const out = JSON.parse(r) as { exitCode: number; stdout: string };
      expect(out.exitCode).toBe(1);
      expect(JSON.parse(out.stdout)).toMatchObject({ code: 7, msg: `for ${ids[i]}` });
    });
  });

  it('keeps serving after clients that reset mid-request or vanish before their answer', async () => {
    const sock = path.join(dir, 'cni.sock');
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let entered = 0;
    const s = await startCniServer({
      socketPath: sock, logger,
      handlers: { ...handlers, add: async (req) => { if (req.containerId === 'gone') { entered++; await held; } } },
    });
    servers.push(s);
    // half a request, then gone
    await new Promise<void>((resolve) => {
      const c = net.connect(sock, () => c.write('{"v":1,"comm', () => { c.destroy(); resolve(); }));
    });
    // a whole request, then gone before the handler answers
    await new Promise<void>((resolve) => {
      const c = net.connect({ path: sock, allowHalfOpen: true }, () => c.end(request({ containerId: 'gone' })));
      const t = setInterval(() => { if (entered === 1) { clearInterval(t); c.destroy(); resolve(); } }, 5);
    });
    release();
    await new Promise((r) => setTimeout(r, 20));
    expect(JSON.parse(await exchange(sock, request()))).toMatchObject({ exitCode: 0 });
  });

  it('does not spin while the handler holds the request of a forwarder that died', async () => {
    // A runtime that times out kills its plugin; the agent's handler may run
    // on for seconds. The dead peer must not keep the listener thread busy.
    const sock = path.join(dir, 'cni.sock');
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let entered = false;
    const s = await startCniServer({ socketPath: sock, logger, handlers: { ...handlers, add: async () => { entered = true; await held; } } });
    servers.push(s);
    const c = net.connect({ path: sock, allowHalfOpen: true }, () => c.end(request()));
    await until(() => entered);
    c.destroy();
    await new Promise((r) => setTimeout(r, 100));
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    await new Promise((r) => setTimeout(r, 600));
    const cpu = process.cpuUsage(cpu0);
    const wall = performance.now() - t0;
    release();
    // a spinning thread would take a whole CPU for the 600 ms
    expect((cpu.user + cpu.system) / 1000).toBeLessThan(wall * 0.3);
    expect(JSON.parse(await exchange(sock, request()))).toMatchObject({ exitCode: 0 });
  });

  it('answers a client that is still sending past the cap, and closes when it does', async () => {
    // The answer comes while the client still writes; the server reads and
    // drops the rest so the client is not stuck, then both sides close.
    const sock = path.join(dir, 'cni.sock');
    await start(sock, { requestReadTimeoutMs: 2000 });
    const big = Buffer.alloc(1 << 20, 0x20);
    const answer = await new Promise<string>((resolve, reject) => {
      const c = net.connect({ path: sock, allowHalfOpen: true });
      const chunks: Buffer[] = [];
      let n = 0;
      const more = () => {
        while (n < 12) {
          n++;
          if (!c.write(big)) return c.once('drain', more);
        }
        c.end();
      };
      c.on('connect', more);
      c.on('data', (d: Buffer) => chunks.push(d));
      c.on('close', () => resolve(Buffer.concat(chunks).toString()));
      c.on('error', reject);
    });
    expect(JSON.parse((JSON.parse(answer) as { stdout: string }).stdout)).toMatchObject({ code: 7 });
  });
});

describe('the addon\'s listener', () => {
  it('closes each connection once answered and the client closed, and answers nothing after close()', async () => {
    const sock = path.join(dir, 'raw.sock');
    const events: [number, number, string][] = [];
    const l = cniListen(sock, { maxRequestBytes: 64, readTimeoutMs: 2000, allowUid: 0, backlog: 8 }, (id, kind, text) => {
      events.push([id, kind, text]);
      l.reply(id, `answer to ${text.length}`);
    });
    try {
      expect(statSync(sock).mode & 0o777).toBe(0o600);
      expect(await exchange(sock, 'x'.repeat(10))).toBe('answer to 10');
      expect(await exchange(sock, 'y'.repeat(100))).toBe('answer to 0'); // over 64: too big, no text
      expect(events.map(([, k]) => k)).toEqual([CniEventKind.request, CniEventKind.tooBig]);
      await until(() => l.open === 0);
      expect(l.reply(events[0]![0], 'again')).toBe(true); // queued, and dropped: that connection is gone
    } finally {
      l.close();
    }
    expect(l.open).toBe(0);
    expect(l.reply(1, 'late')).toBe(false);
    expect(() => cniListen(sock, { maxRequestBytes: 64, readTimeoutMs: 2000, allowUid: 0, backlog: 8 }, () => undefined)).toThrow(/EADDRINUSE/);
    expect(() => cniListen(sock, { maxRequestBytes: 0, readTimeoutMs: 2000, allowUid: 0, backlog: 8 }, () => undefined)).toThrow(/maxRequestBytes must be an integer/);
  });
});
