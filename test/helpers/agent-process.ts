// `meshcap agent --standalone` as its own process, as the DaemonSet runs it:
// the fault tests look at it from outside (/proc/PID: fds, threads, RSS,
// namespaces; whether it is still alive) and read its JSON log lines.
import { readdirSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { execa, type ResultPromise } from 'execa';
import { parseAllDocuments } from 'yaml';
import { projectRoot } from '../../src/paths.js';

export interface AgentProcessOptions {
  pods: string;
  socket: string;
  pinRoot: string;
  stateDir: string;
  mode: 'ebpf' | 'iptables';
  podWaitMs?: number;
  excludeNamespaces?: string[];
  extraArgs?: string[];
  /** SIGUSR2 makes the agent collect garbage (gc-on-signal.cjs; for RSS figures). */
  gcOnSignal?: boolean;
  /** node options before the script, e.g. a test-only --require preload */
  nodeArgs?: string[];
  /** Run with the DaemonSet's literal env values for the agent (deploy/meshcap.yaml: MALLOC_ARENA_MAX, NODE_OPTIONS), as deployed. */
  daemonSetEnv?: boolean;
}

/** The agent container's env with literal values in the shipped DaemonSet (deploy/meshcap.yaml). */
export function daemonSetAgentEnv(): Record<string, string> {
  const env: Record<string, string> = {};
  for (const doc of parseAllDocuments(readFileSync(path.join(projectRoot, 'deploy/meshcap.yaml'), 'utf8'))) {
    const o = doc.toJSON() as { kind?: string; spec?: { template?: { spec?: { containers?: { name: string; env?: { name: string; value?: string }[] }[] } } } } | null;
    if (o?.kind !== 'DaemonSet') continue;
    const agent = o.spec?.template?.spec?.containers?.find((c) => c.name === 'agent');
    for (const e of agent?.env ?? []) if (typeof e.value === 'string') env[e.name] = e.value;
  }
  if (!env.MALLOC_ARENA_MAX) throw new Error('deploy/meshcap.yaml: no DaemonSet container "agent" with MALLOC_ARENA_MAX: the chart changed, update daemonSetAgentEnv');
  return env;
}

export interface ProcFigures {
  fds: number;
  /** fd targets by kind: socket, anon_inode:bpf-map, net:[...], ... */
  fdKinds: Record<string, number>;
  threads: number;
  rssKb: number;
  /** net namespace inodes the agent's fds or threads point at */
  netns: string[];
}

export class AgentProcess {
  readonly logs: Record<string, unknown>[] = [];
  private constructor(readonly proc: ResultPromise, readonly pid: number) {}

  static async start(o: AgentProcessOptions): Promise<AgentProcess> {
    const args = [
      ...(o.gcOnSignal ? ['--expose-gc', '--require', path.join(projectRoot, 'test/helpers/gc-on-signal.cjs')] : []),
      ...(o.nodeArgs ?? []),
      path.join(projectRoot, 'bin/meshcap'), 'agent', '--standalone', '--pods', o.pods, '--socket', o.socket,
      '--pin-root', o.pinRoot, '--state-dir', o.stateDir, '--mode', o.mode, '--pod-wait-ms', String(o.podWaitMs ?? 500),
      '--self-check-interval', '0', '--exclude-namespaces', (o.excludeNamespaces ?? ['kube-system']).join(','), '--log-level', 'info',
      ...(o.extraArgs ?? []),
    ];
    const proc = execa('node', args, { reject: false, stdout: 'pipe', stderr: 'inherit', cleanup: true, ...(o.daemonSetEnv ? { env: daemonSetAgentEnv() } : {}) });
    const a = new AgentProcess(proc, proc.pid!);
    const ready = new Promise<void>((resolve, reject) => {
      const rl = readline.createInterface({ input: proc.stdout! });
      rl.on('line', (l) => {
        let j: Record<string, unknown>;
        try {
          j = JSON.parse(l) as Record<string, unknown>;
        } catch {
          j = { msg: l };
        }
        a.logs.push(j);
        if (j.msg === 'meshcap agent ready') resolve();
      });
      void proc.then((r) => reject(new Error(`meshcap agent exited (${r.exitCode ?? r.signal}) before it was ready: ${JSON.stringify(a.logs.slice(-5))}`)));
    });
    const timer = setTimeout(() => proc.kill('SIGKILL'), 60_000);
    try {
      await ready;
    } finally {
      clearTimeout(timer);
    }
    return a;
  }

  /** A full GC in the agent (started with gcOnSignal), then a moment for it to run. */
  async collectGarbage(): Promise<void> {
    this.proc.kill('SIGUSR2');
    await new Promise((res) => setTimeout(res, 500));
  }

  alive(): boolean {
    return this.proc.exitCode === null && this.proc.signalCode === null;
  }

  figures(): ProcFigures {
    const dir = `/proc/${this.pid}`;
    const fdKinds: Record<string, number> = {};
    const netns = new Set<string>();
    let fds = 0;
    for (const fd of readdirSync(`${dir}/fd`)) {
      let t: string;
      try {
        t = readlinkSync(`${dir}/fd/${fd}`);
      } catch {
        continue; // closed meanwhile
      }
      fds++;
      const kind = t.startsWith('/') ? 'file' : t.replace(/:\[\d+\]$/, '').replace(/^anon_inode:/, '');
      fdKinds[kind] = (fdKinds[kind] ?? 0) + 1;
      if (t.startsWith('net:[')) netns.add(t);
    }
    const threads = readdirSync(`${dir}/task`);
    for (const t of threads) {
      try {
        netns.add(readlinkSync(`${dir}/task/${t}/ns/net`));
      } catch { /* thread gone */ }
    }
    const status = readFileSync(`${dir}/status`, 'utf8');
    const rssKb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? NaN);
    return { fds, fdKinds, threads: threads.length, rssKb, netns: [...netns].sort() };
  }

  async stop(): Promise<void> {
    if (!this.alive()) return;
    this.proc.kill('SIGTERM');
    const t = setTimeout(() => this.proc.kill('SIGKILL'), 10_000);
    await this.proc;
    clearTimeout(t);
  }
}

/**
 * The end of a fault test's agent run, also after a failure: the agent
 * stopped, the lab's namespaces and processes gone, every meshcap pin under
 * pinRoot removed (uninstall --force), the temp dir deleted.
 */
export async function endAgentRun(o: { agent?: AgentProcess; lab: { cleanup(): Promise<void> }; pinRoot: string; tmp?: string }): Promise<void> {
  await o.agent?.stop();
  await o.lab.cleanup();
  // the run's own state dir: --force also takes rules out of the iptables pods
  // recorded there, and the default (/var/run/meshcap/state) is the host's
  const stateDir = o.tmp ? path.join(o.tmp, 'state') : `${o.pinRoot}-no-state`;
  await execa('node', [path.join(projectRoot, 'bin/meshcap'), 'uninstall', '--pin-root', o.pinRoot, '--state-dir', stateDir, '--force'], { reject: false });
  if (o.tmp) rmSync(o.tmp, { recursive: true, force: true });
}
