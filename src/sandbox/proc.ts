// Long-running child processes of the sandbox (agent, proxies, workloads),
// each in its own process group so a Ctrl-C on the terminal reaches only the
// sandbox, which then stops them in order (pods first, so their DEL still
// finds the agent).
import { spawn, type ChildProcess } from 'node:child_process';
import readline from 'node:readline';

export interface Proc {
  readonly name: string;
  readonly pid: number | undefined;
  /** Every stdout line so far. */
  readonly lines: string[];
  stderr(): string;
  onLine(fn: (line: string) => void): void;
  /** Resolves with the first stdout line matching re; rejects if the process exits first or the timeout passes. */
  waitFor(re: RegExp, timeoutMs: number, signal?: AbortSignal): Promise<string>;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  readonly running: boolean;
  /** SIGTERM the group, SIGKILL after graceMs. */
  stop(graceMs?: number): Promise<void>;
}

const STDERR_CAP = 64 << 10;

export function startProc(name: string, cmd: string, args: string[], o: { env?: NodeJS.ProcessEnv } = {}): Proc {
  const child: ChildProcess = spawn(cmd, args, { detached: true, stdio: ['ignore', 'pipe', 'pipe'], env: o.env ?? process.env });
  const lines: string[] = [];
  const listeners: ((l: string) => void)[] = [];
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
    onLine: (fn) => listeners.push(fn),
    exited,
    get running() {
      return running;
    },
    waitFor(re, timeoutMs, signal) {
      const hit = lines.find((l) => re.test(l));
      if (hit) return Promise.resolve(hit);
      return new Promise<string>((resolve, reject) => {
        const done = (f: () => void) => {
          clearTimeout(timer);
          signal?.removeEventListener('abort', onAbort);
          f();
        };
        const timer = setTimeout(() => done(() => reject(new Error(`${name} not ready after ${timeoutMs} ms${tail(err)}`))), timeoutMs);
        const onAbort = () => done(() => reject(signal!.reason));
        signal?.addEventListener('abort', onAbort, { once: true });
        listeners.push((l) => {
          if (re.test(l)) done(() => resolve(l));
        });
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
