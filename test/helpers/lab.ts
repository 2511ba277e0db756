// A throwaway network for privileged tests: namespaces that stand in for pods
// and servers, veth links with addresses from 198.18.0.0/15 and 2001:db8::/32
// that exist only inside them (no default route anywhere), processes running
// inside them, and a cleanup that removes all of it even when a test fails
// (and, as a last resort, when the test process exits). Namespaces, links,
// address checks and cleanup are the product's lab (src/lab), shared with the
// sandbox and the benches; this file adds the test-side processes.
import { execa, type ResultPromise } from 'execa';
import { randomBytes } from 'node:crypto';
import { chmodSync, chownSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import { inNetns, Lab as CoreLab, type InNetnsOpts, type LinkAddrs } from '../../src/lab/index.js';
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
export type RunOpts = Pick<InNetnsOpts, 'uid' | 'gid' | 'caps'>;

const wrap = (ns: string, cmd: string[], o: RunOpts = {}): string[] => inNetns(ns, cmd, o);

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
  private readonly core = new CoreLab('mc');
  readonly id = this.core.id;

  netns(short: string): Promise<{ name: string; path: string }> {
    return this.core.netns(short);
  }

  /** veth between two namespaces with v4 (and optional v6) addresses from the lab ranges; no default route. */
  link(a: string, b: string, addrs: LinkAddrs): Promise<{ aIf: string; bIf: string }> {
    return this.core.link(a, b, addrs);
  }

  exec(ns: string, cmd: string[], o: RunOpts = {}) {
    return execa('ip', wrap(ns, cmd, o));
  }

  /** Start a process in the netns; returns it and a promise for its first stdout line matching `until`. */
  spawn(ns: string, cmd: string[], o: RunOpts & { until?: RegExp } = {}) {
    const p = execa('ip', wrap(ns, cmd, o), { stdin: 'pipe', stdout: 'pipe', stderr: 'pipe', reject: false, buffer: false });
    // Registered after its namespace: cleanup kills it before the namespace goes.
    this.core.add(`process ${cmd[0]} in ${ns}`, async () => {
      p.kill('SIGKILL');
      await p;
    });
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
    // Its events also go to a file it writes before it relays a connection
    // (--events-file): once the app has its answer, the accept is in the
    // file. Read from the stdout pipe instead, a line could still be on its
    // way to this process when the answer was already here (a loaded machine
    // showed it).
    const dir = mkdtempSync(path.join(os.tmpdir(), 'meshcap-proxy-'));
    this.core.add(`proxy events in ${dir}`, () => rmSync(dir, { recursive: true, force: true }));
    chmodSync(dir, 0o755);
    const events = path.join(dir, 'events.jsonl');
    writeFileSync(events, '', { mode: 0o600 });
    chownSync(events, uid, uid);
    const s = this.spawn(ns, [process.execPath, `${projectRoot}/bin/meshcap`, 'proxy', '--events-file', events, ...args], { uid, caps, until: /"event":"ready"/ });
    await s.ready;
    const accepts = () => readFileSync(events, 'utf8').split('\n').filter((l) => l.includes('"event":"accept"')).map((l) => JSON.parse(l) as { listener: string; orig: string; local: string; peer: string; raw: string; optlen: number });
    return {
      ...s,
      accepts,
    };
  }

  async cleanup(): Promise<void> {
    await this.core.close();
  }
}

/**
 * Runs a Python script (with args) in the netns as an ordinary app (uid
 * 1000, not the proxy's), and returns what it printed as JSON; fails with
 * its stderr.
 */
export async function appPython<T>(ns: string, script: string, o: { args?: string[]; timeoutMs?: number } = {}): Promise<T> {
  const r = await execa('ip', ['netns', 'exec', ns, 'setpriv', '--reuid=1000', '--regid=1000', '--clear-groups', '/usr/bin/python3', '-c', script, ...(o.args ?? [])], { reject: false, timeout: scaled(o.timeoutMs ?? 60_000) });
  if (r.exitCode !== 0) throw new Error(`the app's script in ${ns} exited ${r.exitCode ?? r.signal}: ${r.stderr.trim()}`);
  return JSON.parse(r.stdout) as T;
}

/** A unique pin root for one test file. */
export const testPinRoot = () => `/sys/fs/bpf/meshcap-test-${process.pid}-${randomBytes(3).toString('hex')}`;
