// The real Istio programs built by scripts/build-peers.sh (build/istio/), and
// what the differential tests need around them: three throwaway network
// namespaces whose addresses decide Istio's IPv6 detection like a pod's do,
// istio-iptables run in dry-run mode in one of them, istio-cni's ADD path
// (the istio-cni-decide driver) fed pods, and Istio's dry-run record split
// back into the iptables-restore input of each family.
import { execFile, spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { randomBytes } from 'node:crypto';
import { addNetnsSync, addVethSync, delNetnsSync, listNetnsSync } from '../../src/lab/index.js';
import { projectRoot } from '../../src/paths.js';

export const ISTIO_DIR = path.join(projectRoot, 'build', 'istio');
export const ISTIO_IPTABLES = path.join(ISTIO_DIR, 'istio-iptables');
export const ISTIO_CNI = path.join(ISTIO_DIR, 'istio-cni');
export const ISTIO_CNI_DECIDE = path.join(ISTIO_DIR, 'istio-cni-decide');

/** The pinned istio.io/istio version: the one line in scripts/build-peers.sh that sets it. */
export function istioVersion(): string {
  const m = /^ISTIO_VERSION=(\S+)/m.exec(readFileSync(path.join(projectRoot, 'scripts', 'build-peers.sh'), 'utf8'));
  if (!m) throw new Error('scripts/build-peers.sh has no ISTIO_VERSION= line');
  return m[1] as string;
}

/** Fails (never skips) when the peers are not built at the pinned version. */
export function requirePeers(): void {
  const stamp = path.join(ISTIO_DIR, '.versions');
  const missing = [ISTIO_IPTABLES, ISTIO_CNI, ISTIO_CNI_DECIDE].filter((b) => !existsSync(b));
  if (missing.length > 0 || !existsSync(stamp)) {
    throw new Error(`the real Istio binaries are not built (${missing.map((m) => path.basename(m)).join(', ') || 'no stamp'}): run \`npm run build:peers\` (npm test runs it in setup)`);
  }
  const v = istioVersion();
  if (!readFileSync(stamp, 'utf8').includes(`istio=${v}`)) {
    throw new Error(`build/istio was built from another Istio version than ${v}: run \`npm run build:peers\``);
  }
  if (process.getuid?.() !== 0) throw new Error('the Istio differential tests create network namespaces: run as root');
}

// --- the pod-like network namespaces -------------------------------------------

/** Which addresses the namespace has, as a pod's eth0 would. */
export type Family = 'v4' | 'v6' | 'dual';
export const POD_V4 = '198.18.0.2';
export const POD_V6 = '2001:db8::2';

export interface PeerNetns {
  path: Record<Family, string>;
  /** A namespace nothing else uses, for `iptables-restore --test`. */
  scratch: string;
  close(): void;
}

/**
 * Istio decides IPv6 from the addresses of the namespace it runs in
 * (config.getLocalIP): so each family gets a namespace with those addresses
 * (veth pair inside it, no route out). Removed by close() and at exit.
 */
export function createPeerNetns(): PeerNetns {
  const tag = `mc-idiff-${process.pid}-${randomBytes(2).toString('hex')}`;
  const names: string[] = [];
  const close = () => {
    for (const n of names.splice(0)) delNetnsSync(n);
  };
  process.once('exit', close);
  // namespaces a killed run left behind (its process is gone): remove them
  for (const stale of listNetnsSync('mc-idiff-')) {
    const m = /^mc-idiff-(\d+)-/.exec(stale);
    if (m && !existsSync(`/proc/${m[1]}`)) delNetnsSync(stale);
  }
  // the lab (src/lab): lab-range addresses only, a veth pair inside the namespace, no route out
  const make = (suffix: string, v4: boolean, v6: boolean): string => {
    const n = `${tag}-${suffix}`;
    addNetnsSync(n, { lo: false });
    names.push(n);
    addVethSync({ ns: n, ifname: 'eth0', v4: v4 ? [`${POD_V4}/24`] : [], v6: v6 ? [`${POD_V6}/64`] : [] }, { ns: n, ifname: 'peer0' });
    return `/run/netns/${n}`;
  };
  try {
    const p = { v4: make('v4', true, false), v6: make('v6', false, true), dual: make('dual', true, true) };
    const scratch = make('scratch', false, false);
    return { path: p, scratch, close };
  } catch (e) {
    close();
    throw e;
  }
}

// --- Istio's dry-run record ------------------------------------------------------

export interface RestoreInputs {
  v4: string | null;
  v6: string | null;
}

const RESTORE_MSG = /^Running iptables restore with: (\S+) and the following input:\n([\s\S]*)$/;

/**
 * Istio's dry-run dependency (DependenciesStub) writes every command it would
 * run to DRY_RUN_FILE_PATH, one line each, and the stdin of iptables-restore
 * as its lines, so the v4 and v6 inputs follow each other unlabelled. The log
 * names the binary of each restore and repeats its input (trimmed): each
 * logged input must be the next run of stdin lines in the record, and those
 * lines (with their final newline) are the input. The only normalisation:
 * the command lines (iptables-save, ...) are dropped.
 */
export function splitDryRun(record: string, logMessages: readonly string[]): RestoreInputs {
  const lines = record.split('\n');
  if (lines.at(-1) === '') lines.pop();
  const isStdin = (l: string) => l.startsWith('*') || l.startsWith('-') || l.startsWith(':') || l === 'COMMIT';
  const out: RestoreInputs = { v4: null, v6: null };
  let i = 0;
  for (const msg of logMessages) {
    const m = RESTORE_MSG.exec(msg);
    if (!m) continue;
    const logged = (m[2] as string).split('\n');
    while (i < lines.length && !isStdin(lines[i] as string)) i++;
    const block = lines.slice(i, i + logged.length);
    if (block.join('\n') !== logged.join('\n')) {
      throw new Error(`Istio's dry-run record does not hold the logged ${m[1]} input at line ${i + 1}:\n${record}`);
    }
    i += logged.length;
    const text = `${block.join('\n')}\n`;
    if (m[1]!.startsWith('ip6tables')) out.v6 = text;
    else out.v4 = text;
  }
  const rest = lines.slice(i).filter(isStdin);
  if (rest.length > 0) throw new Error(`Istio's dry-run record has iptables-restore lines no log message accounts for:\n${rest.join('\n')}`);
  return out;
}

// --- istio-iptables --------------------------------------------------------------

export interface IstioRun extends RestoreInputs {
  status: number;
  /** Istio's error (the last error-level log line), when it failed. */
  error: string;
}

function run(cmd: string, args: string[], env: Record<string, string>): Promise<{ status: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(cmd, args, { env, maxBuffer: 16 << 20, encoding: 'utf8' }, (err, stdout, stderr) => {
      const status = err ? (typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : 1) : 0;
      resolve({ status, stdout, stderr });
    });
  });
}

/** JSON log lines (--log_as_json) from any stream text. */
function logLines(text: string): Array<{ level: string; msg: string }> {
  const out: Array<{ level: string; msg: string }> = [];
  for (const l of text.split('\n')) {
    if (!l.startsWith('{')) continue;
    try {
      const j = JSON.parse(l) as { level?: string; msg?: string };
      if (typeof j.msg === 'string') out.push({ level: j.level ?? '', msg: j.msg });
    } catch { /* not a log line */ }
  }
  return out;
}

export interface IstioIptablesInput {
  args: readonly string[];
  env: Readonly<Record<string, string>>;
  /** The namespace it runs in (its addresses decide IPv6). */
  netns: string;
  /** /etc/resolv.conf as istio-iptables sees it (a private mount namespace), when given. */
  resolvConf?: string;
}

/**
 * istio-iptables --dry-run in `netns`, with only the given environment (plus
 * PATH): exit status, and each family's restore input from its dry-run record.
 */
export async function runIstioIptables(input: IstioIptablesInput, workDir: string): Promise<IstioRun> {
  const id = randomBytes(6).toString('hex');
  const record = path.join(workDir, `${id}.dry-run`);
  const env: Record<string, string> = { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin', ...input.env, DRY_RUN_FILE_PATH: record };
  const istio = [ISTIO_IPTABLES, '--log_as_json', '--dry-run', ...input.args];
  let cmd: string[];
  if (input.resolvConf !== undefined) {
    const resolv = path.join(workDir, `${id}.resolv.conf`);
    writeFileSync(resolv, input.resolvConf);
    cmd = ['nsenter', `--net=${input.netns}`, '--', 'unshare', '--mount', '--propagation', 'private', '--',
      'sh', '-c', 'mount --bind "$0" /etc/resolv.conf && exec "$@"', resolv, ...istio];
  } else {
    cmd = ['nsenter', `--net=${input.netns}`, '--', ...istio];
  }
  const r = await run(cmd[0] as string, cmd.slice(1), env);
  let text = '';
  try {
    text = readFileSync(record, 'utf8');
  } catch { /* nothing ran */ }
  rmSync(record, { force: true });
  if (input.resolvConf !== undefined) rmSync(path.join(workDir, `${id}.resolv.conf`), { force: true });
  const logs = [...logLines(r.stdout), ...logLines(r.stderr)];
  const errors = logs.filter((l) => l.level === 'error').map((l) => l.msg);
  const cobra = /^Error: .*$/m.exec(r.stderr + r.stdout)?.[0];
  const split = r.status === 0 ? splitDryRun(text, logs.map((l) => l.msg)) : { v4: null, v6: null };
  return { status: r.status, error: errors.at(-1) ?? cobra ?? r.stderr.trim().split('\n').at(-1) ?? '', ...split };
}

/**
 * Whether the kernel's iptables-restore accepts `input` (parsed and checked,
 * not committed: --test) in `netns`: what the real istio-iptables would meet
 * when it applies rules its dry run printed.
 */
export async function iptablesAccepts(input: string, family: 4 | 6, netns: string): Promise<{ ok: boolean; message: string }> {
  const bin = family === 6 ? 'ip6tables-restore' : 'iptables-restore';
  return new Promise((resolve) => {
    const p = spawn('nsenter', [`--net=${netns}`, '--', bin, '--test', '--noflush'], { stdio: ['pipe', 'ignore', 'pipe'] });
    let err = '';
    p.stderr.on('data', (d: Buffer) => (err += d.toString()));
    p.on('close', (code) => resolve({ ok: code === 0, message: err.trim() }));
    p.stdin.end(input);
  });
}

// --- istio-cni's ADD path ----------------------------------------------------------

export interface CniRequest {
  namespace: string;
  name: string;
  pod: unknown;
  netns: string;
  excludeNamespaces: readonly string[];
}

export interface CniAnswer extends RestoreInputs {
  programmed: boolean;
  error: string;
  log: Array<{ level: string; msg: string }>;
}

/**
 * One istio-cni-decide process: requests in, answers out, in order. Each ADD
 * reconfigures Istio's logger, whose rolling log file (lumberjack, in the
 * CNI agent run dir) is never closed: the process is replaced every
 * RESTART_EVERY pods before it runs out of file descriptors.
 */
export class IstioCniDecider {
  private static readonly RESTART_EVERY = 2000;
  private proc!: ChildProcessWithoutNullStreams;
  private waiting: Array<(line: string) => void> = [];
  private nextId = 1;
  private served = 0;
  private stderr = '';

  constructor() {
    this.start();
  }

  private start(): void {
    const waiting: Array<(line: string) => void> = [];
    this.waiting = waiting;
    this.stderr = '';
    const proc = spawn(ISTIO_CNI_DECIDE, [], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.proc = proc;
    proc.stderr.on('data', (d: Buffer) => (this.stderr += d.toString()));
    readline.createInterface({ input: proc.stdout }).on('line', (l) => waiting.shift()?.(l));
    proc.on('exit', (code) => {
      for (const w of waiting.splice(0)) w(JSON.stringify({ driverExit: code, stderr: this.stderr }));
    });
  }

  async decide(req: CniRequest): Promise<CniAnswer> {
    if (++this.served > IstioCniDecider.RESTART_EVERY && this.waiting.length === 0) {
      this.proc.stdin.end();
      this.served = 1;
      this.start();
    }
    const id = this.nextId++;
    const line = await new Promise<string>((resolve) => {
      this.waiting.push(resolve);
      this.proc.stdin.write(`${JSON.stringify({ id, ...req })}\n`);
    });
    const a = JSON.parse(line) as { id?: number; programmed: boolean; error: string; log: CniAnswer['log'] | null; dryRun: string; driverExit?: number; stderr?: string };
    if (a.id !== id) throw new Error(`istio-cni-decide answered out of order or exited (${a.driverExit ?? ''}): ${a.stderr ?? line}`);
    const log = a.log ?? [];
    const split = a.programmed && a.error === '' ? splitDryRun(a.dryRun, log.map((l) => l.msg)) : { v4: null, v6: null };
    return { programmed: a.programmed, error: a.error, log, ...split };
  }

  close(): void {
    this.proc.stdin.end();
  }
}

/** A scratch directory for dry-run records. */
export function makeWorkDir(): { dir: string; close(): void } {
  const dir = mkdtempSync(path.join(tmpdir(), 'meshcap-istio-diff-'));
  return { dir, close: () => rmSync(dir, { recursive: true, force: true }) };
}
