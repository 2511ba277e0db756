// A private, real Kubernetes control plane for tests: etcd and kube-apiserver
// built from their Go modules by scripts/build-k8s.sh (build/k8s/bin/), with
// per-run certificates (openssl), RBAC authorization and service-account
// token signing. Everything listens on 127.0.0.1 (random ports) and lives in
// one temp dir that stop() removes; the processes are also killed when the
// test process exits, is interrupted (SIGINT/SIGTERM), or dies outright
// (setpriv --pdeathsig SIGKILL), so no etcd or kube-apiserver outlives a run.
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { createWriteStream, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { request as httpsRequest } from 'node:https';
import { request as httpRequest } from 'node:http';
import { createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { KubeConfig } from '@kubernetes/client-node';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const K8S_BIN = path.join(repo, 'build/k8s/bin');

/** True when scripts/build-k8s.sh has produced every binary this helper runs. */
export function controlPlaneBuilt(): boolean {
  return ['kube-apiserver', 'etcd', 'etcdctl'].every((b) => existsSync(path.join(K8S_BIN, b)));
}

export interface ControlPlaneOptions {
  /** Extra kube-apiserver flags (appended; a later flag wins). */
  apiserverArgs?: string[];
  /** Keep the temp dir after stop() (also: MESHCAP_K8S_KEEP=1). */
  keep?: boolean;
}

const live = new Set<ChildProcess>();
const dirs = new Set<string>();
let exitHooked = false;

function hookExit(): void {
  if (exitHooked) return;
  exitHooked = true;
  const killAll = () => {
    for (const c of live) {
      try {
        if (c.pid) process.kill(c.pid, 'SIGKILL');
      } catch { /* already gone */ }
    }
    live.clear();
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
    dirs.clear();
  };
  process.on('exit', killAll);
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    process.once(sig, () => {
      killAll();
      process.kill(process.pid, sig);
    });
  }
}

const DIR_PREFIX = 'meshcap-k8s-';

/**
 * Removes the dirs of earlier runs whose test process died without its exit
 * hooks (SIGKILL); pdeathsig already took their etcd and kube-apiserver.
 */
function sweepStaleDirs(): void {
  for (const name of readdirSync(tmpdir())) {
    if (!name.startsWith(DIR_PREFIX)) continue;
    const dir = path.join(tmpdir(), name);
    let owner = NaN;
    try {
      owner = Number(readFileSync(path.join(dir, 'owner.pid'), 'utf8'));
    } catch { /* no pid file: being created, or not ours */ continue; }
    try {
      process.kill(owner, 0);
    } catch {
      rmSync(dir, { recursive: true, force: true });
    }
  }
}

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((resolve, reject) => s.once('error', reject).listen(0, '127.0.0.1', resolve));
  const { port } = s.address() as AddressInfo;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Tail of a log file, for error messages. */
function tail(file: string, lines = 25): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

/** The per-run PKI: CA, kube-apiserver serving cert, admin client cert, SA key pair. */
function makePki(dir: string): void {
  mkdirSync(dir, { recursive: true });
  const ossl = (...args: string[]) => execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
  ossl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ca.key', '-out', 'ca.crt', '-days', '2',
    '-subj', '/CN=meshcap-test-ca',
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign');
  const leaf = (name: string, subj: string, ext: string) => {
    writeFileSync(path.join(dir, `${name}.ext`), ext);
    ossl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', subj);
    ossl('x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial',
      '-days', '2', '-out', `${name}.crt`, '-extfile', `${name}.ext`);
  };
  leaf('apiserver', '/CN=kube-apiserver',
    'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' +
    'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc\n');
  leaf('admin', '/O=system:masters/CN=meshcap-test-admin',
    'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n');
  ossl('genrsa', '-out', 'sa.key', '2048');
  ossl('rsa', '-in', 'sa.key', '-pubout', '-out', 'sa.pub');
}

interface Proc {
  child: ChildProcess;
  exited: Promise<number | null>;
}

export class ControlPlane {
  readonly dir: string;
  readonly pki: string;
  etcdUrl = '';
  apiserverPort = 0;
  /** Milliseconds each component took to become ready the last time it started. */
  readonly startTimes: Record<string, number> = {};
  private etcd: Proc | undefined;
  private apiserver: Proc | undefined;
  private readonly opts: ControlPlaneOptions;
  private etcdPeerUrl = '';

  private constructor(opts: ControlPlaneOptions) {
    this.opts = opts;
    sweepStaleDirs();
    this.dir = mkdtempSync(path.join(tmpdir(), DIR_PREFIX));
    writeFileSync(path.join(this.dir, 'owner.pid'), String(process.pid));
    dirs.add(this.dir);
    this.pki = path.join(this.dir, 'pki');
  }

  static async start(opts: ControlPlaneOptions = {}): Promise<ControlPlane> {
    if (!controlPlaneBuilt()) throw new Error(`control-plane binaries missing in ${K8S_BIN}: run bash scripts/build-k8s.sh (npm run setup does)`);
    hookExit();
    const cp = new ControlPlane(opts);
    try {
      const t0 = Date.now();
      makePki(cp.pki);
      cp.startTimes.pki = Date.now() - t0;
      await cp.startEtcd();
      await cp.startApiserver();
      return cp;
    } catch (err) {
      await cp.stop();
      throw err;
    }
  }

  get apiserverUrl(): string {
    return `https://127.0.0.1:${this.apiserverPort}`;
  }

  get caFile(): string {
    return path.join(this.pki, 'ca.crt');
  }

  get apiserverLog(): string {
    return path.join(this.dir, 'kube-apiserver.log');
  }

  /** A client with the admin certificate (system:masters). */
  adminKubeConfig(): KubeConfig {
    const kc = new KubeConfig();
    kc.loadFromOptions({
      clusters: [{ name: 'test', server: this.apiserverUrl, caFile: this.caFile, skipTLSVerify: false }],
      users: [{ name: 'admin', certFile: path.join(this.pki, 'admin.crt'), keyFile: path.join(this.pki, 'admin.key') }],
      contexts: [{ name: 'test', cluster: 'test', user: 'admin' }],
      currentContext: 'test',
    });
    return kc;
  }

  private spawnLogged(name: string, bin: string, args: string[]): Proc {
    const log = createWriteStream(path.join(this.dir, `${name}.log`), { flags: 'a' });
    // setpriv --pdeathsig: the component dies with the test process even if
    // that is SIGKILLed and its exit hooks never run; nice: npm test runs
    // this beside privileged test files that have deadlines
    const child = spawn('nice', ['-n', '10', 'setpriv', '--pdeathsig', 'SIGKILL', '--', path.join(K8S_BIN, bin), ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stdout!.pipe(log, { end: false });
    child.stderr!.pipe(log, { end: false });
    live.add(child);
    const exited = new Promise<number | null>((resolve) => {
      child.once('exit', (code, signal) => {
        live.delete(child);
        log.end(`\n--- ${name} exited: ${signal ?? code}\n`);
        resolve(code ?? (signal ? -1 : null));
      });
    });
    return { child, exited };
  }

  private async startEtcd(): Promise<void> {
    const t0 = Date.now();
    const [client, peer] = [await freePort(), await freePort()];
    this.etcdUrl = `http://127.0.0.1:${client}`;
    this.etcdPeerUrl = `http://127.0.0.1:${peer}`;
    this.etcd = this.spawnLogged('etcd', 'etcd', [
      '--name', 'meshcap-test',
      '--data-dir', path.join(this.dir, 'etcd-data'),
      '--listen-client-urls', this.etcdUrl,
      '--advertise-client-urls', this.etcdUrl,
      '--listen-peer-urls', this.etcdPeerUrl,
      '--initial-advertise-peer-urls', this.etcdPeerUrl,
      '--initial-cluster', `meshcap-test=${this.etcdPeerUrl}`,
      '--log-level', 'warn',
    ]);
    await this.waitReady('etcd', this.etcd, this.etcdPath('etcd.log'), async () => {
      const body = await httpGet(`${this.etcdUrl}/health`);
      return body.includes('"health":"true"');
    }, 30_000);
    this.startTimes.etcd = Date.now() - t0;
  }

  private etcdPath(f: string): string {
    return path.join(this.dir, f);
  }

  /**
   * Starts kube-apiserver (again, on the same port after the first time) and
   * waits for /readyz; extraArgs apply to this start only.
   */
  async startApiserver(extraArgs: string[] = []): Promise<void> {
    if (this.apiserver) throw new Error('kube-apiserver already running');
    const t0 = Date.now();
    this.apiserverPort ||= await freePort();
    const p = (f: string) => path.join(this.pki, f);
    this.apiserver = this.spawnLogged('kube-apiserver', 'kube-apiserver', [
      '--etcd-servers', this.etcdUrl,
      '--bind-address', '127.0.0.1',
      '--advertise-address', '127.0.0.1',
      '--secure-port', String(this.apiserverPort),
      '--cert-dir', path.join(this.dir, 'apiserver-certs'),
      '--tls-cert-file', p('apiserver.crt'),
      '--tls-private-key-file', p('apiserver.key'),
      '--client-ca-file', p('ca.crt'),
      '--authorization-mode', 'RBAC',
      '--service-account-issuer', 'https://kubernetes.default.svc',
      '--service-account-key-file', p('sa.pub'),
      '--service-account-signing-key-file', p('sa.key'),
      '--service-cluster-ip-range', '10.96.0.0/24',
      // there is no Endpoints object for a loopback advertise address
      '--endpoint-reconciler-type', 'none',
      '--profiling=false',
      '--v', '1',
      ...(this.opts.apiserverArgs ?? []),
      ...extraArgs,
    ]);
    const proc = this.apiserver;
    await this.waitReady('kube-apiserver', proc, this.apiserverLog, async () => {
      const body = await this.adminGet('/readyz');
      return body.trim() === 'ok';
    }, 90_000);
    this.startTimes['kube-apiserver'] = Date.now() - t0;
  }

  /** Kills kube-apiserver (SIGKILL by default: a crash, not a graceful drain). */
  async stopApiserver(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    const p = this.apiserver;
    if (!p) return;
    this.apiserver = undefined;
    await killProc(p, signal);
  }

  /** `etcdctl --endpoints <etcd> ARGS`, stdout. */
  etcdctl(...args: string[]): string {
    return execFileSync(path.join(K8S_BIN, 'etcdctl'), ['--endpoints', this.etcdUrl, ...args], { encoding: 'utf8' });
  }

  /** etcd's current revision (= the API server's newest resourceVersion). */
  etcdRevision(): number {
    const out = JSON.parse(this.etcdctl('endpoint', 'status', '-w', 'json')) as { Status: { header: { revision: number } } }[];
    return out[0]!.Status.header.revision;
  }

  /** Compacts etcd up to its current revision; returns that revision. */
  compactEtcd(): number {
    const rev = this.etcdRevision();
    this.etcdctl('compact', String(rev), '--physical');
    return rev;
  }

  async stop(): Promise<void> {
    const procs = [this.apiserver, this.etcd].filter((p): p is Proc => !!p);
    this.apiserver = undefined;
    this.etcd = undefined;
    for (const p of procs) await killProc(p, 'SIGTERM');
    if (!(this.opts.keep || process.env.MESHCAP_K8S_KEEP === '1')) rmSync(this.dir, { recursive: true, force: true });
    dirs.delete(this.dir);
  }

  private async waitReady(name: string, proc: Proc, log: string, ready: () => Promise<boolean>, timeoutMs: number): Promise<void> {
    const end = Date.now() + timeoutMs;
    let exitCode: number | null | undefined;
    void proc.exited.then((c) => { exitCode = c; });
    let last = '';
    while (Date.now() < end) {
      if (exitCode !== undefined) throw new Error(`${name} exited (${exitCode}) before it was ready; its log:\n${tail(log)}`);
      try {
        if (await ready()) return;
      } catch (err) {
        last = (err as Error).message;
      }
      await sleep(200);
    }
    throw new Error(`${name} not ready after ${timeoutMs / 1000} s (${last}); its log:\n${tail(log)}`);
  }

  /** GET with the admin certificate; resolves the body whatever the status. */
  adminGet(urlPath: string): Promise<string> {
    return new Promise((resolve, reject) => {
      const req = httpsRequest({
        host: '127.0.0.1', port: this.apiserverPort, path: urlPath, method: 'GET',
        ca: readFileSync(this.caFile), cert: readFileSync(path.join(this.pki, 'admin.crt')), key: readFileSync(path.join(this.pki, 'admin.key')),
        timeout: 5000,
      }, (res) => {
        let body = '';
        res.setEncoding('utf8').on('data', (d: string) => { body += d; }).on('end', () => resolve(body));
      });
      req.on('timeout', () => req.destroy(new Error('timeout'))).on('error', reject).end();
    });
  }
}

async function killProc(p: Proc, signal: NodeJS.Signals): Promise<void> {
  if (p.child.exitCode !== null || p.child.signalCode !== null) return;
  p.child.kill(signal);
  const t = setTimeout(() => p.child.kill('SIGKILL'), 10_000);
  await p.exited;
  clearTimeout(t);
}

function httpGet(url: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { timeout: 2000 }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (d: string) => { body += d; }).on('end', () => resolve(body));
    });
    req.on('timeout', () => req.destroy(new Error('timeout'))).on('error', reject).end();
  });
}

/**
 * A TCP relay on 127.0.0.1 in front of a port: the agent's only way to the API
 * server, so a test can cut it off (every connection reset, new ones refused)
 * and heal it, a network partition for one client while others still work.
 */
export class TcpRelay {
  private server: Server | undefined;
  private readonly conns = new Set<Socket>();
  private blocked = false;
  port = 0;

  constructor(private readonly target: number) {}

  async start(): Promise<void> {
    const { connect } = await import('node:net');
    this.server = createServer((c) => {
      if (this.blocked) {
        c.destroy();
        return;
      }
      const up = connect(this.target, '127.0.0.1');
      this.conns.add(c).add(up);
      const drop = () => {
        c.destroy();
        up.destroy();
        this.conns.delete(c);
        this.conns.delete(up);
      };
      c.on('error', drop).on('close', drop);
      up.on('error', drop).on('close', drop);
      c.pipe(up);
      up.pipe(c);
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as AddressInfo).port;
  }

  /** Resets every open connection and refuses new ones until heal(). */
  cut(): void {
    this.blocked = true;
    for (const s of this.conns) s.destroy();
    this.conns.clear();
  }

  heal(): void {
    this.blocked = false;
  }

  async stop(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}
