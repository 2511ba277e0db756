// Asks a running agent who it is, over the CNI socket: one VERSION request
// (wire protocol v1, docs/cni.md), whose reply carries `agent` beside the CNI
// version info. No handler runs for VERSION, so asking never touches a pod.
import net from 'node:net';
import { WIRE_VERSION } from './wire.js';

export type AgentVersionAnswer =
  | {
    reachable: true;
    version: string | null;
    commit: string | null;
    /** The agent's build had uncommitted changes. */
    dirty?: boolean;
    cniVersions: string[];
    /** What the agent says about itself (agents since `meshcap status` shows health; absent before). */
    mode?: string;
    startedAt?: string;
    /** null when ready, else why not. */
    notReady?: string | null;
    podSourceSynced?: boolean;
    pid?: number;
  }
  | { reachable: false; error: string; needsRoot?: boolean };

export function queryAgentVersion(socketPath: string, timeoutMs = 2000): Promise<AgentVersionAnswer> {
  const request = JSON.stringify({ v: WIRE_VERSION, command: 'VERSION', containerId: '', netns: '', ifname: '', args: '', path: '', stdin: '' });
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let settled = false;
    const done = (a: AgentVersionAnswer) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      sock.destroy();
      resolve(a);
    };
    const sock = net.connect(socketPath);
    const timer = setTimeout(() => done({ reachable: false, error: `no answer within ${timeoutMs} ms` }), timeoutMs);
    sock.on('connect', () => sock.end(request));
    sock.on('data', (c: Buffer) => chunks.push(c));
    sock.on('error', (e: NodeJS.ErrnoException) => {
      const why = e.code === 'ENOENT' ? 'no socket there (is the agent running?)'
        : e.code === 'ECONNREFUSED' ? 'nobody listens on it (a stale socket?)'
          : e.code === 'EACCES' ? 'permission denied (the socket is root-only)' : e.message;
      done({ reachable: false, error: why, ...(e.code === 'EACCES' ? { needsRoot: true } : {}) });
    });
    sock.on('end', () => {
      try {
        const r = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
          stdout?: unknown;
          agent?: { version?: unknown; commit?: unknown; dirty?: unknown; mode?: unknown; startedAt?: unknown; notReady?: unknown; podSourceSynced?: unknown; pid?: unknown };
        };
        const a = r.agent ?? {};
        let cniVersions: string[] = [];
        try {
          const info = JSON.parse(String(r.stdout)) as { supportedVersions?: unknown };
          if (Array.isArray(info.supportedVersions)) cniVersions = info.supportedVersions.map(String);
        } catch { /* not version info */ }
        done({
          reachable: true,
          // An agent from before the `agent` field answers without it.
          version: typeof r.agent?.version === 'string' ? r.agent.version : null,
          commit: typeof r.agent?.commit === 'string' ? r.agent.commit : null,
          cniVersions,
          ...(a.dirty === true ? { dirty: true } : {}),
          ...(typeof a.mode === 'string' ? { mode: a.mode } : {}),
          ...(typeof a.startedAt === 'string' ? { startedAt: a.startedAt } : {}),
          ...(a.notReady === null || typeof a.notReady === 'string' ? { notReady: a.notReady } : {}),
          ...(typeof a.podSourceSynced === 'boolean' ? { podSourceSynced: a.podSourceSynced } : {}),
          ...(typeof a.pid === 'number' ? { pid: a.pid } : {}),
        });
      } catch (e) {
        done({ reachable: false, error: `the reply is not JSON: ${(e as Error).message}` });
      }
    });
  });
}
