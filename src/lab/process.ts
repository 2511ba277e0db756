// Processes of a lab: the argv that runs a command inside a namespace (as
// another uid, with capabilities, pinned to a CPU), and long-running
// children (the sandbox's agent, proxies and workloads, a bench's servers)
// each in its own process group, so a Ctrl-C on the terminal reaches only
// the owner, which then stops them in order.
import { spawn, type ChildProcess } from 'node:child_process';
import readline from 'node:readline';

export interface InNetnsOpts {
  uid?: number;
  /** default: uid */
  gid?: number;
  /** ambient capabilities kept across the uid change, e.g. ['net_admin'] */
  caps?: string[];
  /** taskset CPU list, e.g. '0' or '0-1' */
  cpu?: string;
}

/** `ip` arguments that run cmd in the named netns: ip netns exec NS [taskset -c CPU] [setpriv ...] cmd. */
export function inNetns(ns: string, cmd: string[], o: InNetnsOpts = {}): string[] {
  const caps = o.caps?.length ? [`--inh-caps=${o.caps.map((c) => `+${c}`).join(',')}`, `--ambient-caps=${o.caps.map((c) => `+${c}`).join(',')}`] : [];
  const priv = o.uid !== undefined ? ['setpriv', `--reuid=${o.uid}`, `--regid=${o.gid ?? o.uid}`, '--clear-groups', ...caps] : [];
  const cpu = o.cpu !== undefined ? ['taskset', '-c', o.cpu] : [];
  return ['netns', 'exec', ns, ...cpu, ...priv, ...cmd];
}

export interface Proc {
  readonly name: string;
  readonly pid: number | undefined;
  /** Every stdout line so far. */
  readonly lines: string[];
  stderr(): string;
  onLine(fn: (line: string) => void): void;
  /** Resolves with the first stdout line matching re; rejects if the process exits first or the timeout passes. */
  waitFor(re: RegExp, timeoutMs: number, signal?: AbortSignal): Promise<string>;
  /** Like waitFor, for a line printed from now on (an answer to a signal, not an old one). */
  nextLine(re: RegExp, timeoutMs: number, signal?: AbortSignal): Promise<string>;
  /** Send sig to the process group. */
  signal(sig: NodeJS.Signals): void;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  readonly running: boolean;
  /** SIGTERM the group, SIGKILL after graceMs. */
  stop(graceMs?: number): Promise<void>;
}

const STDERR_CAP = 64 << 10;

export function startProc(name: string, cmd: string, args: string[], o: { env?: NodeJS.ProcessEnv } = {}): Proc {
  const child: ChildProcess = spawn(cmd, args, { detached: true, stdio: ['ignore', 'pipe', 'pipe'], env: o.env ?? process.env });
  const lines: string[] = [];
  const listeners = new Set<(l: string) => void>();
  let err = '';
  let running = true;
  child.stderr!.on('data', (d: Buffer) => {
    if (err.length < STDERR_CAP) err += d.toString();
  });
  readline.createInterface({ input: child.stdout! }).on('line', (l) => {
    lines.push(l);
    for (const f of listeners) f(l);
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.once('error', (e) => {
      err += `\n${e.message}`;
      running = false;
      resolve({ code: -1, signal: null });
    });
    child.once('exit', (code, signal) => {
      running = false;
      resolve({ code, signal });
    });
  });
  const kill = (sig: NodeJS.Signals) => {
    if (!running || child.pid === undefined) return;
    try {
      process.kill(-child.pid, sig);
    } catch {
      /* already gone */
    }
  };
  const p: Proc = {
    name,
    pid: child.pid,
    lines,
    stderr: () => err,
    onLine: (fn) => {
      listeners.add(fn);
    },
    exited,
    get running() {
      return running;
    },
    waitFor(re, timeoutMs, signal) {
      const hit = lines.find((l) => re.test(l));
      if (hit) return Promise.resolve(hit);
      return p.nextLine(re, timeoutMs, signal);
    },
    signal: kill,
    nextLine(re, timeoutMs, signal) {
      return new Promise<string>((resolve, reject) => {
        const done = (f: () => void) => {
          clearTimeout(timer);
          listeners.delete(onLine);
          signal?.removeEventListener('abort', onAbort);
          f();
        };
        const timer = setTimeout(() => done(() => reject(new Error(`${name} not ready after ${timeoutMs} ms${tail(err)}`))), timeoutMs);
        const onAbort = () => done(() => reject(signal!.reason));
        signal?.addEventListener('abort', onAbort, { once: true });
        const onLine = (l: string) => {
          if (re.test(l)) done(() => resolve(l));
        };
        listeners.add(onLine);
        void exited.then((r) => done(() => reject(new Error(`${name} exited (${r.code ?? r.signal}) before it was ready${tail(err)}`))));
      });
    },
    async stop(graceMs = 3000) {
      if (!running) return;
      kill('SIGTERM');
      const t = setTimeout(() => kill('SIGKILL'), graceMs);
      await exited;
      clearTimeout(t);
    },
  };
  return p;
}

export function tail(stderr: string, n = 8): string {
  const l = stderr.trim().split('\n').filter(Boolean).slice(-n);
  return l.length ? `:\n  ${l.join('\n  ')}` : '';
}
