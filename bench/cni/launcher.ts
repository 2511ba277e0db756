// Exec of a CNI plugin as a container runtime does it, timed by a small native
// parent (bench/cni/mc-cni-exec.c: posix_spawn, i.e. clone(CLONE_VM|CLONE_VFORK)
// + execve like Go's os/exec in containerd/CRI-O, CLOCK_MONOTONIC to the
// child's exit). Node's own spawn (libuv fork()s the whole Node process) costs
// ~0.9 ms more per exec on this machine, which no runtime pays; runNode keeps
// that figure for comparison with earlier runs.
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { projectRoot } from '../../src/paths.js';
import { compileIfStale } from '../lib/cc.js';

export interface ExecResult {
  code: number | null;
  out: string;
  ms: number;
  /** the plugin's own CPU time (user + system, from wait4), ms; not known for runNode */
  cpuMs?: number;
}

const SRC = path.join(projectRoot, 'bench/cni/mc-cni-exec.c');
const BIN = path.join(projectRoot, 'build/bin/mc-cni-exec');

/** Builds build/bin/mc-cni-exec when missing or older than its source (cc, as bench:datapath builds its tools). */
export function buildLauncher(): string {
  compileIfStale(SRC, BIN);
  return BIN;
}

export class Launcher {
  private readonly proc: ChildProcess;
  private readonly waiting = new Map<string, (r: ExecResult) => void>();
  private next = 0;
  private err = '';

  constructor() {
    this.proc = spawn(buildLauncher(), [], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.proc.stderr!.on('data', (d: Buffer) => {
      this.err += d.toString();
    });
    this.proc.on('exit', (code) => {
      for (const [, done] of this.waiting) done({ code: null, out: `mc-cni-exec exited (${code}): ${this.err}`, ms: NaN });
      this.waiting.clear();
    });
    createInterface({ input: this.proc.stdout! }).on('line', (line) => {
      const [id, code, us, cpuUs, ...out] = line.split('\t');
      const done = this.waiting.get(id!);
      if (!done) return;
      this.waiting.delete(id!);
      done({ code: Number(code), out: out.join('\t'), ms: Number(us) / 1000, cpuMs: Number(cpuUs) / 1000 });
    });
  }

  /** Runs bin with exactly this environment and stdin; resolves at its exit. */
  run(bin: string, env: NodeJS.ProcessEnv, stdin: string): Promise<ExecResult> {
    if (/[\t\n]/.test(stdin)) throw new Error('mc-cni-exec: stdin must hold no TAB or LF (compact JSON)');
    const envText = Object.entries(env).filter(([, v]) => v !== undefined).map(([k, v]) => `${k}=${v}`).join('\x1f');
    if (/[\t\n]/.test(envText)) throw new Error('mc-cni-exec: environment values must hold no TAB or LF');
    const id = String(this.next++);
    return new Promise((resolve) => {
      this.waiting.set(id, resolve);
      this.proc.stdin!.write(`${id}\t${bin}\t${envText}\t${stdin}\n`);
    });
  }

  close(): Promise<void> {
    if (this.proc.exitCode !== null) return Promise.resolve();
    return new Promise((resolve) => {
      this.proc.once('exit', () => resolve());
      this.proc.stdin!.end();
    });
  }
}

/** The same exec from the Node parent (child_process.spawn), timed from spawn to exit. */
export function runNode(bin: string, env: NodeJS.ProcessEnv, stdin: string): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint();
    const p = spawn(bin, [], { env, stdio: ['pipe', 'pipe', 'ignore'] });
    let out = '';
    p.stdout.on('data', (d: Buffer) => {
      out += d.toString();
    });
    p.stdin.on('error', () => undefined); // a plugin may exit without reading stdin
    p.on('error', reject);
    p.on('exit', (code) => {
      const ms = Number(process.hrtime.bigint() - t0) / 1e6;
      resolve({ code, out, ms });
    });
    p.stdin.end(stdin);
  });
}
