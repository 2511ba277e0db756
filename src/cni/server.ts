// The agent's CNI endpoint: a unix socket the meshcap-cni forwarder connects
// to once per runtime call. One bounded request per connection, dispatched
// to the handlers, one reply, one log line. The socket itself is served by
// the addon's thread (native/addon/src/cni_listener.cc): accept, the peer's
// uid, reading to the half-close, and the deadlines happen there, and this
// module sees one event per connection. With node's net.Server each
// connection's Socket and handle wrap outlived their ~2 ms in V8's old space
// and took ~3.6 KB of native memory to the next major GC: a burst of 10,000
// DELs put the agent over its memory budget (docs/bench-scale.md).
import { lstat, mkdir, stat, unlink } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import type { Logger } from 'pino';
import { dispatch } from './dispatch.js';
import { CniError } from './errors.js';
import { CNI_ERROR_CODES } from './rules.js';
import type { CniHandlers } from './types.js';
import { MAX_REQUEST_BYTES, decodeWireRequest, encodeWireReply, type WireReply } from './wire.js';
import { meshcapVersion } from '../version.js';
import { CniEventKind, cniListen } from '../native/addon.js';

export interface CniServerOptions {
  socketPath: string;
  handlers: CniHandlers;
  logger: Logger;
  /** How long a client may take to send its request (default 5000 ms). */
  requestReadTimeoutMs?: number;
  /** More about the agent for every reply's `agent` field (mode, readiness, ...: `meshcap status`): a fresh object each call (the reply adds to it). */
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
 * modes; SO_PEERCRED (the uid the peer had at connect()), which the
 * listener checks at accept, does not care.
 */
const ALLOWED_UID = 0;

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

  const identity = opts.identity;
  const reply = (id: number, r: WireReply) => {
    const { version, commit, dirty } = meshcapVersion();
    let agent: Record<string, unknown> = {};
    try {
      agent = identity?.() ?? {};
    } catch { /* the reply matters more than the identity */ }
    // Filled in place, not spread: an object spread here (`{ ...more, version }`)
    // put ~900 bytes a request into V8's old space (new hidden classes, it
    // seems), 10x what the rest of the request left there (docs/bench-scale.md).
    agent.version = version;
    agent.commit = commit;
    if (dirty) agent.dirty = dirty;
    listener.reply(id, encodeWireReply({ exitCode: r.exitCode, stdout: r.stdout, agent: agent as NonNullable<WireReply['agent']> }));
  };
  const reject = (id: number, err: CniError, ageMs: number) => {
    logger.warn({ verb: '?', result: 'error', code: err.code, error: err.message, durationMs: round(ageMs) }, 'cni request rejected');
    reply(id, errorReply(err));
  };

  const onEvent = (id: number, kind: CniEventKind, text: string, pid: number, uid: number, gid: number, ageMs: number) => {
    switch (kind) {
      case CniEventKind.request:
        serveRequest(id, text, performance.now() - ageMs);
        return;
      case CniEventKind.refused: {
        const why = text !== ''
          ? `cannot tell who connected: ${text}`
          : `peer pid ${pid} runs as uid ${uid}, and only root (uid ${ALLOWED_UID}) may use the CNI socket`;
        logger.warn({ peerPid: text !== '' ? undefined : pid, peerUid: uid >= 0 ? uid : undefined, peerGid: gid >= 0 ? gid : undefined, reason: why }, 'refused a CNI connection from a process that is not root');
        // no agent identity for a stranger
        listener.reply(id, encodeWireReply({ exitCode: 1, stdout: JSON.stringify(new CniError(CNI_ERROR_CODES.INTERNAL, `permission denied: ${why}`).toResult(undefined)) }));
        return;
      }
      case CniEventKind.tooBig:
        reject(id, new CniError(CNI_ERROR_CODES.INVALID_NETWORK_CONFIG, `forwarder request exceeds ${MAX_REQUEST_BYTES} bytes`), ageMs);
        return;
      case CniEventKind.timeout:
        reject(id, new CniError(CNI_ERROR_CODES.IO_FAILURE, `forwarder request not complete within ${readTimeoutMs} ms`), ageMs);
        return;
      case CniEventKind.error:
        logger.error({ socketPath, error: text }, 'cni socket listener error');
        return;
      default:
        logger.error({ socketPath, kind }, 'cni listener sent an unknown event');
    }
  };

  const serveRequest = (id: number, text: string, started: number) => {
    let raw;
    try {
      raw = decodeWireRequest(text);
    } catch (err) {
      reject(id, err as CniError, performance.now() - started);
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
        durationMs: round(performance.now() - started),
      };
      // The answer first: the runtime waits for it, nobody waits for the log line.
      reply(id, o.reply);
      if (o.unexpected !== undefined) {
        logger.error({ ...fields, err: o.unexpected }, 'cni request failed unexpectedly');
      } else if (o.error) {
        logger.info({ ...fields, error: o.error.message }, 'cni request');
      } else {
        logger.info(fields, 'cni request');
      }
    });
  };

  // Binds 0600 (under umask 0177) and listens before it returns.
  const listener = cniListen(socketPath, { maxRequestBytes: MAX_REQUEST_BYTES, readTimeoutMs, allowUid: ALLOWED_UID, backlog: 511 }, onEvent);
  logger.info({ socketPath }, 'cni server listening');

  return {
    address: socketPath,
    async close() {
      // A forwarder cut off mid-request reports the agent unreachable, which
      // for ADD is "try again later": safe.
      listener.close();
      // (A second agent cannot have replaced it: start refuses a socket that still answers.)
      try {
        await unlink(socketPath);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      }
    },
  };
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}
