// The agent's CNI endpoint: a unix socket the meshcap-cni forwarder connects
// to once per runtime call. One bounded request per connection, dispatched
// to the handlers, one reply, one log line.
import { chmod, lstat, mkdir, stat, unlink } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import type { Logger } from 'pino';
import { dispatch } from './dispatch.js';
import { CniError } from './errors.js';
import { CNI_ERROR_CODES } from './rules.js';
import type { CniHandlers } from './types.js';
import { MAX_REQUEST_BYTES, decodeWireRequest, encodeWireReply, type WireReply } from './wire.js';
import { meshcapVersion } from '../version.js';
import { peerCredentials, type PeerCredentials } from '../native/addon.js';

export interface CniServerOptions {
  socketPath: string;
  handlers: CniHandlers;
  logger: Logger;
  /** How long a client may take to send its request (default 5000 ms). */
  requestReadTimeoutMs?: number;
  /** More about the agent for every reply's `agent` field (mode, readiness, ...: `meshcap status`). */
  identity?: () => Record<string, unknown>;
}

export interface CniServer {
  close(): Promise<void>;
  address: string;
}

function errorReply(err: CniError): WireReply {
  return { exitCode: 1, stdout: JSON.stringify(err.toResult(undefined)) };
}

/**
 * Only root may use the socket: the container runtime runs its plugins as
 * root, and a request here can remove any pod's capture (DEL) or set one up.
 * The socket file is 0600 in a 0700 directory, but a process with
 * CAP_DAC_OVERRIDE, or a socket directory someone made wider, gets past file
 * modes; SO_PEERCRED (the uid the peer had at connect()) does not care.
 * Returns why the peer is refused, or undefined.
 */
function peerRefusal(sock: net.Socket): { why: string; cred?: PeerCredentials } | undefined {
  const fd = (sock as unknown as { _handle?: { fd?: unknown } })._handle?.fd;
  if (typeof fd !== 'number' || fd < 0) return { why: 'cannot tell who connected (no socket fd)' };
  let cred: PeerCredentials;
  try {
    cred = peerCredentials(fd);
  } catch (err) {
    return { why: `cannot tell who connected: ${(err as Error).message}` };
  }
  if (cred.uid !== 0) return { why: `peer pid ${cred.pid} runs as uid ${cred.uid}, and only root (uid 0) may use the CNI socket`, cred };
  return undefined;
}

/** Is something listening on this socket path? */
function socketAnswers(socketPath: string): Promise<boolean> {
  return new Promise((resolve) => {
    const c = net.connect(socketPath);
    c.once('connect', () => {
      c.destroy();
      resolve(true);
    });
    c.once('error', () => resolve(false));
  });
}

/** Removes a socket left by a previous agent; refuses to remove a live one or a non-socket. */
async function removeStaleSocket(socketPath: string): Promise<void> {
  let st;
  try {
    st = await lstat(socketPath);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw err;
  }
  if (!st.isSocket()) throw new Error(`CNI socket path ${socketPath} exists and is not a socket; remove it or choose another --socket`);
  if (await socketAnswers(socketPath)) {
    throw new Error(`CNI socket ${socketPath} is already served by another process (another meshcap agent?); stop it or choose another --socket`);
  }
  await unlink(socketPath);
}

export async function startCniServer(opts: CniServerOptions): Promise<CniServer> {
  const { socketPath, handlers, logger } = opts;
  const readTimeoutMs = opts.requestReadTimeoutMs ?? 5000;
  // Only the root-owned agent and the runtime's plugin (root) may talk here.
  const dir = path.dirname(socketPath);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const dirStat = await stat(dir);
  if (dirStat.uid !== 0 || ((dirStat.mode & 0o022) !== 0 && (dirStat.mode & 0o1000) === 0)) {
    // whoever may write there may replace the socket with one of their own
    logger.warn({ dir, mode: (dirStat.mode & 0o7777).toString(8), owner: dirStat.uid }, 'the CNI socket directory is not root-only: whoever can write to it can replace the socket; make it root-owned 0700 (or 1777 at least)');
  }
  await removeStaleSocket(socketPath);

  const open = new Set<net.Socket>();
  const server = net.createServer({ allowHalfOpen: true }, (sock) => {
    open.add(sock);
    sock.once('close', () => open.delete(sock));
    sock.on('error', (err) => logger.debug({ err }, 'cni connection error'));
    const refused = peerRefusal(sock);
    if (refused) {
      logger.warn({ peerPid: refused.cred?.pid, peerUid: refused.cred?.uid, peerGid: refused.cred?.gid, reason: refused.why }, 'refused a CNI connection from a process that is not root');
      // no agent identity for a stranger; read and drop what it sends
      sock.on('data', () => undefined);
      sock.end(encodeWireReply({ exitCode: 1, stdout: JSON.stringify(new CniError(CNI_ERROR_CODES.INTERNAL, `permission denied: ${refused.why}`).toResult(undefined)) }));
      setTimeout(() => sock.destroy(), readTimeoutMs).unref();
      return;
    }
    serveConnection(sock, handlers, logger, readTimeoutMs, opts.identity);
  });

  // Created 0600 (umask 0177 around the bind, which listen() does before it
  // returns), not only chmod'ed after: no moment in which others may connect.
  // (process.umask throws in worker threads; the chmod still applies there.)
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    let umask: number | undefined;
    try {
      umask = process.umask(0o177);
    } catch { /* worker thread */ }
    try {
      server.listen(socketPath, () => {
        server.off('error', reject);
        resolve();
      });
    } finally {
      if (umask !== undefined) process.umask(umask);
    }
  });
  await chmod(socketPath, 0o600);
  server.on('error', (err) => logger.error({ err, socketPath }, 'cni socket server error'));
  logger.info({ socketPath }, 'cni server listening');

  return {
    address: socketPath,
    async close() {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      // A forwarder cut off mid-request reports the agent unreachable, which
      // for ADD is "try again later": safe.
      for (const s of open) s.destroy();
      await closed;
      // libuv unlinks the path on close; this covers the rest. (A second agent
      // cannot have replaced it: start refuses a socket that still answers.)
      try {
        await unlink(socketPath);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      }
    },
  };
}

function serveConnection(sock: net.Socket, handlers: CniHandlers, logger: Logger, readTimeoutMs: number, identity?: () => Record<string, unknown>): void {
  const started = performance.now();
  const chunks: Buffer[] = [];
  let size = 0;
  let done = false;

  const reply = (r: WireReply) => {
    if (!sock.destroyed) {
      const { version, commit, dirty } = meshcapVersion();
      let more: Record<string, unknown> = {};
      try {
        more = identity?.() ?? {};
      } catch { /* the reply matters more than the identity */ }
      sock.end(encodeWireReply({ ...r, agent: { ...more, version, commit, ...(dirty ? { dirty } : {}) } }));
    }
  };
  const reject = (err: CniError, verb = '?') => {
    // Keep draining (the data handler drops chunks once done) so a client
    // still sending is not stuck and reads this answer.
    done = true;
    logger.warn({ verb, result: 'error', code: err.code, error: err.message, durationMs: ms(started) }, 'cni request rejected');
    reply(errorReply(err));
  };

  // Timers run before I/O in a loop turn: after the loop was held longer than
  // the deadline (a long pass, GC, a starved CPU), a request that arrived in
  // time still sits unread. setImmediate lets that turn's reads come first.
  const timer = setTimeout(() => setImmediate(() => {
    if (!done) reject(new CniError(CNI_ERROR_CODES.IO_FAILURE, `forwarder request not complete within ${readTimeoutMs} ms`));
  }), readTimeoutMs);
  timer.unref();

  sock.on('data', (chunk: Buffer) => {
    if (done) return;
    size += chunk.length;
    if (size > MAX_REQUEST_BYTES) {
      clearTimeout(timer);
      reject(new CniError(CNI_ERROR_CODES.INVALID_NETWORK_CONFIG, `forwarder request exceeds ${MAX_REQUEST_BYTES} bytes`));
      return;
    }
    chunks.push(chunk);
  });
  sock.on('end', () => {
    if (done) return;
    done = true;
    clearTimeout(timer);
    let raw;
    try {
      raw = decodeWireRequest(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size));
    } catch (err) {
      reject(err as CniError);
      return;
    }
    void dispatch(raw, handlers).then((o) => {
      const fields = {
        verb: o.verb,
        podNamespace: o.podNamespace,
        podName: o.podName,
        containerId: o.containerId,
        decision: o.decision,
        mode: o.mode,
        result: o.error ? 'error' : 'ok',
        code: o.error?.code,
        durationMs: ms(started),
      };
      // The answer first: the runtime waits for it, nobody waits for the log line.
      reply(o.reply);
      if (o.unexpected !== undefined) {
        logger.error({ ...fields, err: o.unexpected }, 'cni request failed unexpectedly');
      } else if (o.error) {
        logger.info({ ...fields, error: o.error.message }, 'cni request');
      } else {
        logger.info(fields, 'cni request');
      }
    });
  });
}

function ms(since: number): number {
  return Math.round((performance.now() - since) * 100) / 100;
}
