// A throwaway network for privileged tests: namespaces that stand in for pods
// and servers, veth links with addresses from 198.18.0.0/15 and 2001:db8::/32
// that exist only inside them (no default route anywhere), processes running
// inside them, and a cleanup that removes all of it even when a test fails
// (and, as a last resort, when the test process exits).
import { execa, type ResultPromise } from 'execa';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import { projectRoot } from '../../src/paths.js';

const NS_AGENT = fileURLToPath(new URL('./ns-agent.mjs', import.meta.url));

/**
 * Deadlines in helpers and tests are sized for the host. Under software
 * emulation (the kernel matrix's TCG guests, test/kernels/run.mjs) the same
 * work is 10-20x slower, so run.mjs sets MESHCAP_TEST_TIME_SCALE there; 1 otherwise.
 */
export const TIME_SCALE = ((v) => {
  if (v === undefined || v === '') return 1;
  const n = Number(v);
  if (!(n >= 1)) throw new Error(`MESHCAP_TEST_TIME_SCALE='${v}': use a number >= 1 (how many times slower than the host)`);
  return n;
})(process.env.MESHCAP_TEST_TIME_SCALE);
/** A host-sized duration (ms, or a count of fixed-interval retries) stretched by TIME_SCALE. */
export const scaled = (n: number): number => Math.ceil(n * TIME_SCALE);

// ns-agent.mjs's own deadlines for ops called without timeoutMs; only used to
// stretch them when TIME_SCALE > 1.
const NS_AGENT_DEADLINES: Record<string, number> = { connect: 5000, connectMany: 20_000, udpAsk: 3000, pingPong: 10_000 };
const live = new Set<string>();
process.once('exit', () => {
  for (const ns of live) {
    try {
      execFileSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
    } catch {
      /* already gone */
    }
  }
});

export interface RunOpts {
  uid?: number;
  gid?: number;
  /** ambient capabilities kept across the uid change, e.g. ['net_admin'] */
  caps?: string[];
}

function wrap(ns: string, cmd: string[], o: RunOpts = {}): string[] {
  const caps = o.caps?.length ? [`--inh-caps=${o.caps.map((c) => `+${c}`).join(',')}`, `--ambient-caps=${o.caps.map((c) => `+${c}`).join(',')}`] : [];
  const priv = o.uid !== undefined ? ['setpriv', `--reuid=${o.uid}`, `--regid=${o.gid ?? o.uid}`, '--clear-groups', ...caps] : [];
  return ['netns', 'exec', ns, ...priv, ...cmd];
}

/** A JSON-lines driven helper process inside a netns (test/helpers/ns-agent.mjs). */
export class NsAgent {
  private next = 1;
  private readonly waiting = new Map<number, { res: (v: unknown) => void; rej: (e: Error) => void }>();
  constructor(private readonly proc: ResultPromise, readonly ready: Promise<void>) {
    readline.createInterface({ input: proc.stdout! }).on('line', (line) => {
      let m: { id?: number; ok?: boolean; result?: unknown; error?: string; ready?: boolean };
      try {
        m = JSON.parse(line);
      } catch {
        return;
      }
      const w = m.id !== undefined ? this.waiting.get(m.id) : undefined;
      if (!w) return;
      this.waiting.delete(m.id!);
      if (m.ok) w.res(m.result);
      else w.rej(new Error(m.error));
    });
  }
  call<T = Record<string, unknown>>(op: string, args: Record<string, unknown> = {}): Promise<T> {
    const id = this.next++;
    if (TIME_SCALE !== 1) {
      const t = typeof args.timeoutMs === 'number' ? args.timeoutMs : NS_AGENT_DEADLINES[op];
      if (t !== undefined) args = { ...args, timeoutMs: scaled(t) };
    }
    return new Promise<T>((res, rej) => {
      this.waiting.set(id, { res: res as (v: unknown) => void, rej });
      this.proc.stdin!.write(JSON.stringify({ id, op, ...args }) + '\n');
    });
  }
  connect(host: string, port: number, payload = '', local?: { address?: string; port?: number }) {
    return this.call<{ data: string; local: string }>('connect', {
      host, port, payload, ...(local?.address ? { localAddress: local.address } : {}), ...(local?.port ? { localPort: local.port } : {}),
    });
  }
  listen(host: string, port: number, mode: 'tag' | 'echo' = 'tag') {
    return this.call('listen', { host, port, mode });
  }
  kill() {
    this.proc.kill('SIGKILL');
  }
}

export class Lab {
  readonly id = randomBytes(3).toString('hex');
  private readonly nss: string[] = [];
  private readonly procs: ResultPromise[] = [];
  private links = 0;

  async netns(short: string): Promise<{ name: string; path: string }> {
    const name = `mc-${short}-${this.id}`;
    await execa('ip', ['netns', 'add', name]);
    this.nss.push(name);
    live.add(name);
    await execa('ip', ['-n', name, 'link', 'set', 'lo', 'up']);
    return { name, path: `/var/run/netns/${name}` };
  }

  /** veth between two namespaces with v4 (and optional v6) addresses; no default route. */
  async link(a: string, b: string, addrs: { a4?: string[]; b4?: string[]; a6?: string[]; b6?: string[] }): Promise<{ aIf: string; bIf: string }> {
    const n = this.links++;
    const aIf = `mc${this.id}${n}a`;
    const bIf = `mc${this.id}${n}b`;
    await execa('ip', ['link', 'add', aIf, 'netns', a, 'type', 'veth', 'peer', 'name', bIf, 'netns', b]);
    for (const [ns, ifn, v4, v6] of [[a, aIf, addrs.a4, addrs.a6], [b, bIf, addrs.b4, addrs.b6]] as const) {
      for (const x of v4 ?? []) await execa('ip', ['-n', ns, 'addr', 'add', x, 'dev', ifn]);
      for (const x of v6 ?? []) await execa('ip', ['-n', ns, '-6', 'addr', 'add', x, 'dev', ifn, 'nodad']);
      await execa('ip', ['-n', ns, 'link', 'set', ifn, 'up']);
    }
    return { aIf, bIf };
  }

  exec(ns: string, cmd: string[], o: RunOpts = {}) {
    return execa('ip', wrap(ns, cmd, o));
  }

  /** Start a process in the netns; returns it and a promise for its first stdout line matching `until`. */
  spawn(ns: string, cmd: string[], o: RunOpts & { until?: RegExp } = {}) {
    const p = execa('ip', wrap(ns, cmd, o), { stdin: 'pipe', stdout: 'pipe', stderr: 'pipe', reject: false, buffer: false });
    this.procs.push(p);
    const lines: string[] = [];
    let stderr = '';
    p.stderr!.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    const ready = new Promise<void>((res, rej) => {
      const rl = readline.createInterface({ input: p.stdout! });
      rl.on('line', (l) => {
        lines.push(l);
        if (!o.until || o.until.test(l)) res();
      });
      p.then((r) => rej(new Error(`${cmd.join(' ')} in ${ns} exited (${r.exitCode ?? r.signal}) before it was ready: ${stderr.trim()}`)));
    });
    // Callers that wait get the rejection; a process nobody waits for (killed at cleanup) must not raise an unhandled one.
    ready.catch(() => undefined);
    return { proc: p, lines, ready, stderr: () => stderr };
  }

  async agent(ns: string, o: RunOpts = {}): Promise<NsAgent> {
    const s = this.spawn(ns, [process.execPath, NS_AGENT], { ...o, until: /"ready":true/ });
    const a = new NsAgent(s.proc, s.ready);
    await s.ready;
    return a;
  }

  /** The reference proxy inside a pod netns, as the proxy uid (default 1337). */
  async proxy(ns: string, args: string[] = [], uid = 1337, caps: string[] = []) {
    const s = this.spawn(ns, [process.execPath, `${projectRoot}/bin/meshcap`, 'proxy', ...args], { uid, caps, until: /"event":"ready"/ });
    await s.ready;
    return {
      ...s,
      accepts: () => s.lines.filter((l) => l.includes('"event":"accept"')).map((l) => JSON.parse(l) as { listener: string; orig: string; local: string; peer: string; raw: string; optlen: number }),
    };
  }

  async cleanup(): Promise<void> {
    for (const p of this.procs) p.kill('SIGKILL');
    await Promise.allSettled(this.procs);
    for (const ns of this.nss.reverse()) {
      await execa('ip', ['netns', 'del', ns], { reject: false });
      live.delete(ns);
    }
  }
}

/** A unique pin root for one test file. */
export const testPinRoot = () => `/sys/fs/bpf/meshcap-test-${process.pid}-${randomBytes(3).toString('hex')}`;
