// `meshcap status`, first part: is this node's meshcap healthy? The agent
// (over its CNI socket: reachable, version, ready, mode, uptime, pod source
// synced) and the CNI chain (is meshcap-cni in the network config the
// runtime uses, and last). Read-only; root is needed for the socket (0600).
import path from 'node:path';
import { queryAgentVersion, type AgentVersionAnswer } from '../cni/agent-query.js';
import { findPrimary, type ConfFile } from '../install-cni/config.js';
import { readConfDir } from '../install-cni/files.js';
import { formatVersion, meshcapVersion } from '../version.js';

export const DEFAULT_CNI_CONF_DIR = '/etc/cni/net.d';

export interface ChainStatus {
  confDir: string;
  /** The file the runtime uses: the first loadable .conf/.conflist/.json by name. */
  file: string | null;
  /** meshcap-cni's place in its plugins list; null when absent. */
  position: number | null;
  plugins: string[];
  ok: boolean;
  detail: string;
}

export interface NodeHealth {
  socket: string;
  agent: AgentVersionAnswer;
  /** Seconds since the agent started, when it says. */
  uptimeS: number | null;
  /** The agent is another build than this CLI. */
  versionDiffers: boolean;
  chain: ChainStatus;
}

/** The file the runtime uses by libcni's rules (the ones install-cni follows: src/install-cni/config.ts) and meshcap-cni's place in it. */
export function chainStatus(confDir: string): ChainStatus {
  let files: ConfFile[];
  try {
    files = readConfDir(confDir);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    return { confDir, file: null, position: null, plugins: [], ok: false, detail: code === 'ENOENT' ? `${confDir} does not exist` : `cannot read ${confDir}: ${code ?? (e as Error).message}` };
  }
  const primary = findPrimary(files);
  if (!primary) return { confDir, file: null, position: null, plugins: [], ok: false, detail: `no CNI network config in ${confDir}` };
  const file = path.join(confDir, primary.file.name);
  const plugins = primary.loaded.plugins.map((p) => String(p.type ?? '?'));
  const at = plugins.indexOf('meshcap-cni');
  const last = at >= 0 && at === plugins.length - 1;
  return {
    confDir, file, position: at >= 0 ? at : null, plugins, ok: last,
    detail: at < 0 ? `meshcap-cni is not in ${file} (plugins: ${plugins.join(', ') || 'none'}): new pods are not captured`
      : last ? `meshcap-cni is last in ${file}` : `meshcap-cni is in ${file} but not last (plugins: ${plugins.join(', ')}): it must see the final prevResult`,
  };
}

export async function collectNodeHealth(opts: { socket: string; cniConfDir: string; now?: number }): Promise<NodeHealth> {
  const agent = await queryAgentVersion(opts.socket);
  const self = meshcapVersion();
  const started = agent.reachable && agent.startedAt ? Date.parse(agent.startedAt) : NaN;
  return {
    socket: opts.socket,
    agent,
    uptimeS: Number.isFinite(started) ? Math.max(0, Math.round(((opts.now ?? Date.now()) - started) / 1000)) : null,
    versionDiffers: agent.reachable && agent.version !== null && (agent.version !== self.version || agent.commit !== self.commit),
    chain: chainStatus(opts.cniConfDir),
  };
}

export function formatDuration(s: number): string {
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
  return `${Math.floor(s / 86400)}d${String(Math.floor((s % 86400) / 3600)).padStart(2, '0')}h`;
}

/** The AGENT block, one fact a line, the most important first. */
export function formatNodeHealth(h: NodeHealth): string {
  const a = h.agent;
  const rows: [string, string][] = [];
  if (!a.reachable) {
    rows.push(['agent', `NOT REACHABLE at ${h.socket}: ${a.error}${a.needsRoot ? ' (run as root)' : ''}`]);
  } else {
    rows.push(['agent', `reachable at ${h.socket}${a.pid ? ` (pid ${a.pid})` : ''}`]);
    rows.push(['ready', a.notReady === undefined ? 'unknown (the agent does not report it)' : a.notReady === null ? 'yes' : `NO: ${a.notReady}`]);
    rows.push(['mode', a.mode ?? 'unknown']);
    rows.push(['version', a.version === null ? 'unknown (older agent)' : `${formatVersion({ version: a.version, commit: a.commit, ...(a.dirty ? { dirty: true } : {}) })}${h.versionDiffers ? `  (this CLI: ${formatVersion(meshcapVersion())})` : ''}`]);
    rows.push(['uptime', h.uptimeS === null ? 'unknown' : formatDuration(h.uptimeS)]);
    rows.push(['pod source', a.podSourceSynced === undefined ? 'unknown' : a.podSourceSynced ? 'synced' : 'NOT synced yet (ADD waits for pods)']);
  }
  rows.push(['CNI chain', `${h.chain.ok ? '' : 'PROBLEM: '}${h.chain.detail}`]);
  const w = Math.max(...rows.map(([k]) => k.length));
  return rows.map(([k, v]) => `${k.padEnd(w)}  ${v}`).join('\n');
}
