// bench:scale --listen: each registered pod gets the listening sockets its
// sidecar would have (bench/scale/mc-listen-netns.c), so that mc_listen
// fills as on a node of real proxies and the agent's passes read it as they
// would there. Without them the pods are namespaces with no socket at all.
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { createInterface, type Interface } from 'node:readline';
import { projectRoot } from '../../src/paths.js';
import { compileIfStale } from '../lib/cc.js';

const SRC = path.join(projectRoot, 'bench/scale/mc-listen-netns.c');
const BIN = path.join(projectRoot, 'build/bin/mc-listen-netns');
/** Listeners per pod: the inbound port on 0.0.0.0 and [::], the outbound port on 0.0.0.0; each with a socket per proxy worker. */
export const LISTENERS_PER_POD = 3;

/** One helper process: its sockets, up to `cap` pods' worth (its open-file limit). */
class Helper {
  private readonly proc: ChildProcess;
  private readonly lines: Interface;
  private readonly answers: string[] = [];
  private waiter: ((line: string) => void) | undefined;
  cap = 0;
  pods = 0;

  constructor(inboundPort: number, outboundPort: number, workers: number) {
    compileIfStale(SRC, BIN);
    this.proc = spawn(BIN, [], { stdio: ['pipe', 'pipe', 'inherit'] });
    this.lines = createInterface({ input: this.proc.stdout! });
    this.lines.on('line', (l) => {
      if (this.waiter) {
        const w = this.waiter;
        this.waiter = undefined;
        w(l);
      } else this.answers.push(l);
    });
    this.proc.on('exit', (code) => this.waiter?.(`error mc-listen-netns exited (${code})`));
    // its stdin closes with it; what it said is in its answer
    this.proc.stdin!.on('error', () => undefined);
    this.proc.stdin!.write(`${inboundPort} ${outboundPort} ${workers}\n`);
  }

  private answer(): Promise<string> {
    const l = this.answers.shift();
    return l !== undefined ? Promise.resolve(l) : new Promise((r) => { this.waiter = r; });
  }

  async start(): Promise<void> {
    const line = await this.answer();
    const m = /^cap (\d+)$/.exec(line);
    if (!m || Number(m[1]) < 1) throw new Error(`bench:scale --listen: ${line.replace(/^error /, '')}`);
    this.cap = Number(m[1]);
  }

  /** Opens the sockets in these namespaces; resolves with the sockets this helper holds in all. */
  async add(netnsPaths: string[]): Promise<number> {
    this.proc.stdin!.write(netnsPaths.map((p) => `${p}\n`).join('') + '\n');
    const line = await this.answer();
    const m = /^ok (\d+)$/.exec(line);
    if (!m) throw new Error(`bench:scale --listen: ${line.replace(/^error /, '')}`);
    this.pods += netnsPaths.length;
    return Number(m[1]);
  }

  close(): void {
    this.lines.close();
    this.proc.stdin!.end();
    this.proc.kill();
  }
}

export class PodListeners {
  private readonly helpers: Helper[] = [];
  private readonly held: number[] = [];

  /** workers: sockets per listener (SO_REUSEPORT, one per proxy worker thread). */
  constructor(private readonly inboundPort: number, private readonly outboundPort: number, readonly workers = 1) {}

  get socketsPerPod(): number {
    return LISTENERS_PER_POD * this.workers;
  }

  /** Opens the sockets in these namespaces, starting helpers as their open-file limits require; resolves with the sockets held in all. */
  async add(netnsPaths: string[]): Promise<number> {
    if (netnsPaths.some((p) => p.includes('\n'))) throw new Error('mc-listen-netns: a netns path holds a newline');
    let rest = netnsPaths;
    while (rest.length > 0) {
      let h = this.helpers.at(-1);
      if (!h || h.pods >= h.cap) {
        h = new Helper(this.inboundPort, this.outboundPort, this.workers);
        this.helpers.push(h);
        this.held.push(0);
        await h.start();
      }
      const take = rest.slice(0, h.cap - h.pods);
      rest = rest.slice(take.length);
      this.held[this.helpers.length - 1] = await h.add(take);
    }
    return this.held.reduce((a, b) => a + b, 0);
  }

  /** Closes every socket (each helper exits at the end of its stdin). */
  close(): void {
    for (const h of this.helpers) h.close();
  }
}
