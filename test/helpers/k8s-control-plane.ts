// A private, real Kubernetes control plane for tests: etcd and kube-apiserver
// built from their Go modules by scripts/build-k8s.sh (build/k8s/bin/), with
// per-run certificates (openssl), RBAC authorization and service-account
// token signing. Everything listens on 127.0.0.1 (random ports) and lives in
// one temp dir that stop() removes; the processes are also killed when the
// test process exits, is interrupted (SIGINT/SIGTERM), or dies outright
// (setpriv --pdeathsig SIGKILL), so no etcd or kube-apiserver outlives a run.
// startControllers() adds kube-controller-manager and kube-scheduler (built by
// `scripts/build-k8s.sh --node`), each with its own client certificate; the
// node itself (containerd, kubelet) is test/helpers/k8s-node.ts.
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { createWriteStream, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { request as httpsRequest } from 'node:https';
import { request as httpRequest } from 'node:http';
import { createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { CoreV1Api, KubeConfig } from '@kubernetes/client-node';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const K8S_BIN = path.join(repo, 'build/k8s/bin');

/** True when scripts/build-k8s.sh has produced every binary this helper runs. */
export function controlPlaneBuilt(): boolean {
  return ['kube-apiserver', 'etcd', 'etcdctl'].every((b) => existsSync(path.join(K8S_BIN, b)));
}

export interface ControlPlaneOptions {
  /** Extra kube-apiserver flags (appended; a later flag wins). */
  apiserverArgs?: string[];
  /** --authorization-mode (a list flag: repeating it is an error); default RBAC. A node needs Node,RBAC. */
  authorizationMode?: string;
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
    // a node's dir has mounts, cgroups and a bridge to undo first:
    // sweepStaleNodes() in test/helpers/k8s-node.ts removes it
    if (existsSync(path.join(dir, 'node.json'))) continue;
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

export interface Proc {
  child: ChildProcess;
  exited: Promise<number | null>;
}

/** An X.509 client identity: CN is the user, O the groups. */
export interface Identity {
  cn: string;
  o?: string;
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
  /** kube-controller-manager, kube-scheduler, and whatever a node helper starts: stopped (last first) before the API server. */
  private readonly components: { name: string; proc: Proc }[] = [];
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

  /** adminKubeConfig() as a kubeconfig file, for a process of its own (the agent, istio-cni). */
  writeAdminKubeconfig(file: string): void {
    writeFileSync(file, JSON.stringify({
      apiVersion: 'v1', kind: 'Config', 'current-context': 'admin',
      clusters: [{ name: 'test', cluster: { server: this.apiserverUrl, 'certificate-authority': this.caFile } }],
      users: [{ name: 'admin', user: { 'client-certificate': path.join(this.pki, 'admin.crt'), 'client-key': path.join(this.pki, 'admin.key') } }],
      contexts: [{ name: 'admin', context: { cluster: 'test', user: 'admin' } }],
    }));
  }

  /**
   * A namespace and its default service account, which pod admission wants:
   * without startControllers() no controller-manager makes it.
   */
  async createNamespace(name: string): Promise<void> {
    const core = this.adminKubeConfig().makeApiClient(CoreV1Api);
    await core.createNamespace({ body: { metadata: { name } } });
    await core.createNamespacedServiceAccount({ namespace: name, body: { metadata: { name: 'default' } } });
  }

  /** Starts build/k8s/bin/BIN (or an absolute path) logging to DIR/NAME.log. */
  spawnLogged(name: string, bin: string, args: string[], env?: NodeJS.ProcessEnv): Proc {
    const log = createWriteStream(path.join(this.dir, `${name}.log`), { flags: 'a' });
    // setpriv --pdeathsig: the component dies with the test process even if
    // that is SIGKILLed and its exit hooks never run; nice: npm test runs
    // this beside privileged test files that have deadlines
    const child = spawn('nice', ['-n', '10', 'setpriv', '--pdeathsig', 'SIGKILL', '--', path.isAbsolute(bin) ? bin : path.join(K8S_BIN, bin), ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
      ...(env ? { env } : {}),
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
      '--authorization-mode', this.opts.authorizationMode ?? 'RBAC',
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

  /**
   * A client certificate signed by the run's CA (pki/NAME.crt, NAME.key) and a
   * kubeconfig using it (returned path), for a component or a user.
   */
  issueClient(name: string, id: Identity): string {
    const ossl = (...args: string[]) => execFileSync('openssl', args, { cwd: this.pki, stdio: ['ignore', 'ignore', 'pipe'] });
    const subj = `${id.o ? `/O=${id.o}` : ''}/CN=${id.cn}`;
    writeFileSync(path.join(this.pki, `${name}.ext`), 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n');
    ossl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', subj);
    ossl('x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial',
      '-days', '2', '-out', `${name}.crt`, '-extfile', `${name}.ext`);
    const file = path.join(this.dir, `${name}.kubeconfig`);
    writeFileSync(file, [
      'apiVersion: v1', 'kind: Config',
      `clusters: [{name: test, cluster: {server: "${this.apiserverUrl}", certificate-authority: "${this.caFile}"}}]`,
      `users: [{name: ${name}, user: {client-certificate: "${path.join(this.pki, `${name}.crt`)}", client-key: "${path.join(this.pki, `${name}.key`)}"}}]`,
      `contexts: [{name: test, context: {cluster: test, user: ${name}}}]`,
      'current-context: test', '',
    ].join('\n'));
    return file;
  }

  /** A serving certificate for 127.0.0.1 and the given IPs (pki/NAME.crt, NAME.key). */
  issueServing(name: string, cn: string, ips: string[]): { cert: string; key: string } {
    const ossl = (...args: string[]) => execFileSync('openssl', args, { cwd: this.pki, stdio: ['ignore', 'ignore', 'pipe'] });
    writeFileSync(path.join(this.pki, `${name}.ext`), 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' +
      `subjectAltName=${['127.0.0.1', ...ips].map((ip) => `IP:${ip}`).join(',')},DNS:localhost\n`);
    ossl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${cn}`);
    ossl('x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial',
      '-days', '2', '-out', `${name}.crt`, '-extfile', `${name}.ext`);
    return { cert: path.join(this.pki, `${name}.crt`), key: path.join(this.pki, `${name}.key`) };
  }

  /**
   * Starts a component that stop() ends (last started, first stopped, before
   * the API server) and waits until ready() holds.
   */
  async startComponent(name: string, bin: string, args: string[], ready: () => Promise<boolean>, opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv } = {}): Promise<Proc> {
    const t0 = Date.now();
    const proc = this.spawnLogged(name, bin, args, opts.env);
    this.components.push({ name, proc });
    await this.waitReady(name, proc, path.join(this.dir, `${name}.log`), ready, opts.timeoutMs ?? 60_000);
    this.startTimes[name] = Date.now() - t0;
    return proc;
  }

  /** Ends one component started by startComponent (SIGTERM, SIGKILL after 10 s). */
  async stopComponent(name: string, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    const i = this.components.findIndex((c) => c.name === name);
    if (i < 0) return;
    const [c] = this.components.splice(i, 1);
    await killProc(c!.proc, signal);
  }

  /**
   * kube-controller-manager and kube-scheduler, each with its own identity
   * (system:kube-controller-manager, system:kube-scheduler: the bootstrap RBAC
   * roles), serving on 127.0.0.1 only. The controller manager signs nothing;
   * it creates the default service accounts and publishes kube-root-ca.crt
   * (projected service-account volumes need it), runs the DaemonSet, node
   * lifecycle and garbage-collector controllers.
   */
  async startControllers(): Promise<void> {
    const kcm = this.issueClient('kube-controller-manager', { cn: 'system:kube-controller-manager' });
    const sched = this.issueClient('kube-scheduler', { cn: 'system:kube-scheduler' });
    const healthz = (port: number) => async () => (await httpsGetInsecure(port, '/healthz')).trim() === 'ok';
    const kcmPort = await freePort();
    await this.startComponent('kube-controller-manager', 'kube-controller-manager', [
      '--kubeconfig', kcm,
      '--authentication-kubeconfig', kcm,
      '--authorization-kubeconfig', kcm,
      '--bind-address', '127.0.0.1',
      '--secure-port', String(kcmPort),
      '--cert-dir', path.join(this.dir, 'kcm-certs'),
      '--leader-elect=false',
      '--root-ca-file', this.caFile,
      '--service-account-private-key-file', path.join(this.pki, 'sa.key'),
      // each controller as its own service account (system:controller:*), as kubeadm runs it
      '--use-service-account-credentials=true',
      '--controllers', '*',
      '--profiling=false',
      '--v', '1',
    ], healthz(kcmPort));
    const schedPort = await freePort();
    await this.startComponent('kube-scheduler', 'kube-scheduler', [
      '--kubeconfig', sched,
      '--authentication-kubeconfig', sched,
      '--authorization-kubeconfig', sched,
      '--bind-address', '127.0.0.1',
      '--secure-port', String(schedPort),
      '--cert-dir', path.join(this.dir, 'scheduler-certs'),
      '--leader-elect=false',
      '--profiling=false',
      '--v', '1',
    ], healthz(schedPort));
  }

  async stop(): Promise<void> {
    for (const c of this.components.splice(0).reverse()) await killProc(c.proc, 'SIGTERM');
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

/** GET https://127.0.0.1:PORT/PATH without verifying the (self-signed) serving certificate. */
function httpsGetInsecure(port: number, urlPath: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = httpsRequest({ host: '127.0.0.1', port, path: urlPath, method: 'GET', rejectUnauthorized: false, timeout: 2000 }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (d: string) => { body += d; }).on('end', () => resolve(body));
    });
    req.on('timeout', () => req.destroy(new Error('timeout'))).on('error', reject).end();
  });
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
