// A real Kubernetes node on this host for tests: containerd v2 (CRI, runc)
// and kubelet, built by `scripts/build-k8s.sh --node`, registered with the
// private control plane of test/helpers/k8s-control-plane.ts.
//
// Everything lives in the control plane's private dir (DIR below), which is
// bind-mounted on itself and made rshared (kubelet's volume mounts and
// containerd's netns mounts propagate into the containers that ask for it,
// as on a systemd host):
//   DIR/containerd/{root,state}, its sockets, DIR/s (shim sockets),
//   DIR/runc (runc state), DIR/kubelet (kubelet --root-dir),
//   DIR/pod-logs, DIR/cni/{bin,net.d} (a private CNI bin and conf dir),
//   DIR/bpffs (a private bpffs instance: meshcap's pins).
// Outside DIR it creates, and stop() removes: the bridge (a 198.19.0.0/24
// pod range with no route out of it; its address 198.19.0.1 is the node IP),
// the cgroup root /meshcap-node-XXXX in every hierarchy (kubepods below it),
// and kubelet's /var/log/containers symlinks. The host's /etc/cni/net.d,
// /opt/cni/bin, /var/lib/kubelet, /run/containerd and iptables stay as they
// are (kubelet's iptables chains are off: makeIPTablesUtilChains false).
// sweepStaleNodes() cleans what a SIGKILLed run left; leftovers() lists what
// is left, for the teardown check.
import { execFile, execFileSync, spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, readFileSync, readdirSync, readlinkSync, rmdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ControlPlane, K8S_BIN } from './k8s-control-plane.js';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const NODE_BINS = ['kubelet', 'kube-controller-manager', 'kube-scheduler', 'kubectl', 'containerd', 'containerd-shim-runc-v2', 'ctr'];
/** Debian's containernetworking-plugins (scripts/setup.sh installs it). */
const CNI_PLUGIN_DIR = '/usr/lib/cni';
export const POD_SUBNET = '198.19.0.0/24';
export const NODE_IP = '198.19.0.1';

export function nodeBuilt(): boolean {
  return NODE_BINS.every((b) => existsSync(path.join(K8S_BIN, b)));
}

/** What a node created outside its dir: enough for a later run to clean up after a SIGKILL. */
interface NodeRecord {
  dir: string;
  bridge: string;
  cgroupRoot: string;
  owner: number;
  /** kubelet creates /var/log/containers for its symlinks; removed again when it was not there before. */
  ownsVarLogContainers: boolean;
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function run(cmd: string, args: string[], input?: string): string {
  return execFileSync(cmd, args, { encoding: 'utf8', input, stdio: ['pipe', 'pipe', 'pipe'] });
}

/** Every mounted cgroup hierarchy (v1 controllers and the v2 one), from mountinfo. */
export function cgroupMounts(): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8').split('\n').flatMap((l) => {
    const [pre, post] = l.split(' - ');
    if (!pre || !post) return [];
    const fstype = post.split(' ')[0];
    return fstype === 'cgroup' || fstype === 'cgroup2' ? [pre.split(' ')[4]!] : [];
  });
}

/** Mount points at or below dir, deepest first. */
function mountsUnder(dir: string): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8').split('\n')
    .map((l) => l.split(' ')[4])
    .filter((m): m is string => !!m && (m === dir || m.startsWith(`${dir}/`)))
    .sort((a, b) => b.length - a.length);
}

/**
 * Pids of the node's processes: kubelet, containerd and the shims name their
 * paths under dir (the shims carry containerd's socket path); etcd and
 * kube-apiserver (dir/etcd-data, dir/pki) are the control plane's.
 */
function pidsNaming(dir: string): number[] {
  const out: number[] = [];
  const marks = ['containerd', 'kubelet', 'runc', 's/'].map((m) => `${dir}/${m}`);
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e) || Number(e) === process.pid) continue;
    try {
      const cmd = readFileSync(`/proc/${e}/cmdline`, 'utf8');
      if (marks.some((m) => cmd.includes(m))) out.push(Number(e));
    } catch { /* gone */ }
  }
  return out;
}

/** Pids in a cgroup subtree (any hierarchy). */
function pidsInCgroup(root: string): number[] {
  const out: number[] = [];
  const walk = (d: string) => {
    try {
      for (const p of readFileSync(path.join(d, 'cgroup.procs'), 'utf8').split('\n')) if (p) out.push(Number(p));
      for (const e of readdirSync(d, { withFileTypes: true })) if (e.isDirectory()) walk(path.join(d, e.name));
    } catch { /* gone */ }
  };
  walk(root);
  return out;
}

/** rmdir a cgroup subtree, children first (cgroupfs dirs cannot be rm -r'd). */
function rmCgroupTree(d: string): void {
  let entries: string[] = [];
  try {
    entries = readdirSync(d, { withFileTypes: true }).filter((e) => e.isDirectory()).map((e) => e.name);
  } catch { return; }
  for (const e of entries) rmCgroupTree(path.join(d, e));
  try { rmdirSync(d); } catch { /* busy: reported by leftovers() */ }
}

/**
 * Removes everything a node made, in the order that lets each step succeed:
 * processes (kubelet, containerd, shims, containers), mounts under dir, the
 * cgroup root, the bridge, kubelet's log symlinks, then dir itself (with
 * removeDir). Idempotent; used by stop() and for runs that died.
 */
export function cleanupNode(rec: NodeRecord, removeDir = true): void {
  for (let round = 0; round < 5; round++) {
    const pids = new Set([...pidsNaming(rec.dir), ...cgroupMounts().flatMap((m) => pidsInCgroup(path.join(m, rec.cgroupRoot)))]);
    if (!pids.size) break;
    for (const p of pids) {
      try { process.kill(p, 'SIGKILL'); } catch { /* gone */ }
    }
    spawnSync('sleep', ['0.3']);
  }
  for (const m of mountsUnder(rec.dir)) spawnSync('umount', ['-l', m]);
  for (const m of cgroupMounts()) rmCgroupTree(path.join(m, rec.cgroupRoot));
  spawnSync('ip', ['link', 'del', rec.bridge], { stdio: 'ignore' });
  try {
    for (const e of readdirSync('/var/log/containers')) {
      const p = path.join('/var/log/containers', e);
      try {
        if (readlinkSync(p).startsWith(`${rec.dir}/`)) rmSync(p, { force: true });
      } catch { /* not a link */ }
    }
    if (rec.ownsVarLogContainers) rmdirSync('/var/log/containers');
  } catch { /* no dir, or not empty: not ours to remove */ }
  if (removeDir && mountsUnder(rec.dir).length === 0) rmSync(rec.dir, { recursive: true, force: true });
}

/** Cleans up the nodes of earlier runs whose test process died without its exit hooks. */
export function sweepStaleNodes(): void {
  for (const name of readdirSync(tmpdir())) {
    const file = path.join(tmpdir(), name, 'node.json');
    if (!existsSync(file)) continue;
    let rec: NodeRecord;
    try {
      rec = JSON.parse(readFileSync(file, 'utf8')) as NodeRecord;
    } catch { continue; }
    try {
      process.kill(rec.owner, 0);
      continue; // alive
    } catch { /* dead: clean */ }
    cleanupNode(rec);
  }
}

/** What is left of a node after stop(): empty when the teardown was complete. */
export function leftovers(rec: NodeRecord, before: HostSnapshot): string[] {
  const left: string[] = [];
  const pids = pidsNaming(rec.dir);
  if (pids.length) left.push(`processes naming ${rec.dir}: ${pids.map((p) => `${p} ${readCmd(p)}`).join('; ')}`);
  const mounts = mountsUnder(rec.dir);
  if (mounts.length) left.push(`mounts: ${mounts.join(', ')}`);
  for (const m of cgroupMounts()) if (existsSync(path.join(m, rec.cgroupRoot))) left.push(`cgroup ${path.join(m, rec.cgroupRoot)}`);
  if (existsSync(`/sys/class/net/${rec.bridge}`)) left.push(`link ${rec.bridge}`);
  if (existsSync(rec.dir)) left.push(`state dir ${rec.dir}`);
  const now = hostSnapshot();
  for (const k of Object.keys(now) as (keyof HostSnapshot)[]) {
    if (now[k] !== before[k]) left.push(`${k} changed:\n--- before\n${before[k]}\n--- after\n${now[k]}`);
  }
  return left;
}

function readCmd(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').slice(0, 200);
  } catch { return '?'; }
}

/** Host state a node must leave as it found it. */
export interface HostSnapshot {
  iptables: string;
  ip6tables: string;
  hostCni: string;
  links: string;
  varLogContainers: string;
  runContainerd: string;
}

export function hostSnapshot(): HostSnapshot {
  // rules a node could add (kubelet's KUBE-*, the CNI plugins' CNI-*, the
  // pod range): other tests on this host may change unrelated ones meanwhile
  const rules = (bin: string) => {
    try {
      return (run(bin, ['-S']) + run(bin, ['-t', 'nat', '-S']) + run(bin, ['-t', 'mangle', '-S']))
        .split('\n').filter((l) => /KUBE-|CNI-|meshcap|198\.19\./i.test(l)).join('\n');
    } catch (err) { return `(${bin}: ${(err as Error).message})`; }
  };
  const ls = (d: string) => {
    try { return readdirSync(d).sort().join(' '); } catch { return '(none)'; }
  };
  return {
    iptables: rules('iptables'),
    ip6tables: rules('ip6tables'),
    hostCni: `${ls('/etc/cni/net.d')} | ${ls('/opt/cni/bin')}`,
    links: run('ip', ['-o', 'link', 'show']).split('\n').map((l) => l.split(':')[1]?.trim().split('@')[0] ?? '').filter((l) => l.startsWith('mcbr')).sort().join(' '),
    varLogContainers: ls('/var/log/containers'),
    runContainerd: ls('/run/containerd'),
  };
}

export interface NodeOptions {
  nodeName: string;
  /** OCI archives imported into containerd's k8s.io namespace. */
  images: string[];
  /** The sandbox (pause) image reference, one of the imported images. */
  pauseImage: string;
  /** Plugins after bridge in the conflist (the meshcap-cni entry while the installer does not write it). */
  chained?: object[];
}

/** A kubeconfig file kubectl can use (admin) and the node's pieces. */
export class KubeNode {
  readonly record: NodeRecord;
  readonly adminKubeconfig: string;
  readonly bpffs: string;
  readonly cniBin: string;
  readonly cniConfDir: string;
  readonly podLogs: string;
  readonly containerdSock: string;
  readonly startTimes: Record<string, number> = {};

  private constructor(readonly cp: ControlPlane, readonly opts: NodeOptions) {
    const id = path.basename(cp.dir).replace(/^meshcap-k8s-/, '').toLowerCase().replace(/[^a-z0-9]/g, '').slice(0, 6);
    this.record = { dir: cp.dir, bridge: `mcbr${id}`, cgroupRoot: `/meshcap-node-${id}`, owner: process.pid, ownsVarLogContainers: !existsSync('/var/log/containers') };
    this.adminKubeconfig = cp.issueClient('admin-kubectl', { cn: 'meshcap-test-admin', o: 'system:masters' });
    this.bpffs = path.join(cp.dir, 'bpffs');
    this.cniBin = path.join(cp.dir, 'cni/bin');
    this.cniConfDir = path.join(cp.dir, 'cni/net.d');
    this.podLogs = path.join(cp.dir, 'pod-logs');
    this.containerdSock = path.join(cp.dir, 'containerd/containerd.sock');
  }

  get dir(): string {
    return this.cp.dir;
  }

  /**
   * Starts containerd and kubelet against cp (which must run
   * kube-controller-manager and kube-scheduler, and kube-apiserver with
   * --authorization-mode Node,RBAC and --allow-privileged) and waits for the
   * node to be Ready.
   */
  static async start(cp: ControlPlane, opts: NodeOptions): Promise<KubeNode> {
    if (!nodeBuilt()) throw new Error(`node binaries missing in ${K8S_BIN}: run bash scripts/build-k8s.sh --node (npm run test:k8s does)`);
    sweepStaleNodes();
    const n = new KubeNode(cp, opts);
    writeFileSync(path.join(cp.dir, 'node.json'), JSON.stringify(n.record));
    const stopOnExit = () => cleanupNode(n.record);
    process.on('exit', stopOnExit);
    // Ctrl-C / SIGTERM: undo the node (mounts first) before the control
    // plane's handler ends etcd and kube-apiserver, removes the dir and
    // re-raises the signal
    const onSignal = () => cleanupNode(n.record);
    const signals = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;
    for (const sig of signals) process.prependOnceListener(sig, onSignal);
    n.detach = () => {
      process.off('exit', stopOnExit);
      for (const sig of signals) process.off(sig, onSignal);
    };
    try {
      let t = Date.now();
      n.prepareHost();
      n.startTimes.host = Date.now() - t;
      t = Date.now();
      await n.startContainerd();
      n.startTimes.containerd = Date.now() - t;
      t = Date.now();
      for (const img of opts.images) n.ctr('images', 'import', '--local', img);
      n.startTimes['image import'] = Date.now() - t;
      t = Date.now();
      await n.startKubelet();
      n.startTimes.kubelet = Date.now() - t;
      return n;
    } catch (err) {
      await n.stop();
      throw err;
    }
  }

  private detach: () => void = () => {};

  /** The shared self-bind of DIR, the private bpffs, cgroup root, bridge, CNI dirs. */
  private prepareHost(): void {
    const d = this.dir;
    run('mount', ['--bind', d, d]);
    run('mount', ['--make-rshared', d]);
    mkdirSync(this.bpffs, { recursive: true });
    // a bpffs instance of its own: the DaemonSet mounts it at /sys/fs/bpf
    // (Bidirectional needs a shared mount; the host's are private here)
    run('mount', ['-t', 'bpf', 'bpf', this.bpffs]);
    run('mount', ['--make-shared', this.bpffs]);
    for (const m of cgroupMounts()) mkdirSync(path.join(m, this.record.cgroupRoot), { recursive: true });
    const br = this.record.bridge;
    run('ip', ['link', 'add', br, 'type', 'bridge']);
    run('ip', ['addr', 'add', `${NODE_IP}/24`, 'dev', br]);
    run('ip', ['link', 'set', br, 'up']);
    mkdirSync(this.cniBin, { recursive: true });
    mkdirSync(this.cniConfDir, { recursive: true });
    for (const p of ['bridge', 'host-local', 'loopback']) copyFileSync(path.join(CNI_PLUGIN_DIR, p), path.join(this.cniBin, p));
    execFileSync('chmod', ['755', ...['bridge', 'host-local', 'loopback'].map((p) => path.join(this.cniBin, p))]);
    this.writeConflist(this.opts.chained ?? []);
    mkdirSync(this.podLogs, { recursive: true });
  }

  /**
   * The node's CNI config: bridge + host-local on POD_SUBNET (no gateway, no
   * routes, no masquerade: pods reach each other and the node address only),
   * then the chained plugins.
   */
  writeConflist(chained: object[]): void {
    const conf = {
      cniVersion: '1.0.0',
      name: 'meshcap-e2e',
      plugins: [
        {
          type: 'bridge', bridge: this.record.bridge, isGateway: false, ipMasq: false, hairpinMode: true,
          ipam: { type: 'host-local', dataDir: path.join(this.dir, 'cni/ipam'), ranges: [[{ subnet: POD_SUBNET, rangeStart: '198.19.0.10', rangeEnd: '198.19.0.250' }]] },
        },
        ...chained,
      ],
    };
    writeFileSync(path.join(this.cniConfDir, '10-meshcap-e2e.conflist'), JSON.stringify(conf, null, 2));
  }

  ctr(...args: string[]): string {
    return run(path.join(K8S_BIN, 'ctr'), ['--address', this.containerdSock, '-n', 'k8s.io', ...args]);
  }

  private async startContainerd(): Promise<void> {
    const d = this.dir;
    const cfg = path.join(d, 'containerd/config.toml');
    mkdirSync(path.dirname(cfg), { recursive: true });
    writeFileSync(cfg, `version = 3
root = "${d}/containerd/root"
state = "${d}/containerd/state"
# NRI would listen on /var/run/nri; tracing exports nothing here
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "${this.containerdSock}"
[ttrpc]
  address = "${this.containerdSock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "${d}/containerd/opt"
  [plugins."io.containerd.shim.v1.manager"]
    socket_dir = "${d}/s"
  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = "${this.opts.pauseImage}"
  [plugins."io.containerd.cri.v1.runtime"]
    netns_mounts_under_state_dir = true
    # this host grants no CAP_SYS_RESOURCE: a negative oom_score_adj (the
    # sandbox's -998) is refused by the kernel, so cap it at containerd's own
    restrict_oom_score_adj = true
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["${this.cniBin}"]
      conf_dir = "${this.cniConfDir}"
      max_conf_num = 1
    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          BinaryName = "/usr/sbin/runc"
          Root = "${d}/runc"
          SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri"]
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
`);
    await this.cp.startComponent('containerd', 'containerd', ['--config', cfg, '--log-level', 'info'], async () => {
      if (!existsSync(this.containerdSock)) return false;
      this.ctr('version');
      return true;
    }, { env: { ...process.env, PATH: `${K8S_BIN}:${process.env.PATH ?? ''}` } });
  }

  private async startKubelet(): Promise<void> {
    const d = this.dir;
    const name = this.opts.nodeName;
    const kubeconfig = this.cp.issueClient('kubelet', { cn: `system:node:${name}`, o: 'system:nodes' });
    const serving = this.cp.issueServing('kubelet-serving', name, [NODE_IP]);
    const port = 20000 + Math.floor(Math.random() * 20000);
    const healthzPort = port + 1;
    const cfg = path.join(d, 'kubelet-config.yaml');
    writeFileSync(cfg, `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# this host mounts cgroup v1 controllers (cgroup2 only at .../unified):
# kubelet 1.37 refuses that unless told (docs/kubernetes-e2e.md)
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: ${this.record.cgroupRoot}
cgroupsPerQOS: true
# the API server's streaming (exec, logs) reaches kubelet on the node address,
# a test-only bridge address; healthz on loopback
address: ${NODE_IP}
port: ${port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${healthzPort}
tlsCertFile: ${serving.cert}
tlsPrivateKeyFile: ${serving.key}
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: ${this.cp.caFile}}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://${this.containerdSock}
makeIPTablesUtilChains: false
failSwapOn: false
resolvConf: ""
podLogsDir: ${this.podLogs}
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
syncFrequency: 10s
fileCheckFrequency: 10s
`);
    await this.cp.startComponent('kubelet', 'kubelet', [
      '--config', cfg,
      '--kubeconfig', kubeconfig,
      '--root-dir', path.join(d, 'kubelet'),
      '--hostname-override', name,
      '--node-ip', NODE_IP,
      '--v', '1',
    ], async () => {
      const body = await this.cp.adminGet(`/api/v1/nodes/${name}`);
      const node = JSON.parse(body) as { status?: { conditions?: { type: string; status: string }[] } };
      return node.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;
    }, { timeoutMs: 120_000 });
  }

  /**
   * kubectl with the admin kubeconfig; stdout. Asynchronous, so a Ctrl-C
   * handler can run (and tear the node down) while kubectl waits.
   */
  kubectl(args: string[], input?: string): Promise<string> {
    return new Promise((resolve, reject) => {
      const child = execFile(path.join(K8S_BIN, 'kubectl'), ['--kubeconfig', this.adminKubeconfig, ...args], { encoding: 'utf8', timeout: 200_000, maxBuffer: 64 << 20 }, (err, stdout, stderr) => {
        if (err) reject(new Error(`kubectl ${args.join(' ')} failed (${(err as { code?: unknown }).code ?? err.message}): ${stderr || stdout}`));
        else resolve(stdout);
      });
      child.stdin!.end(input ?? '');
    });
  }

  /**
   * Deletes every pod (the kubelet tears each sandbox down: CNI DEL reaches
   * the chain), then ends kubelet and containerd and removes what the node
   * made. The control plane is the caller's to stop afterwards.
   * beforeUnmount runs once no container is left, before the private bpffs
   * and the other mounts go (to unpin what the pods pinned there).
   */
  async stop(beforeUnmount?: () => void): Promise<void> {
    try {
      if (existsSync(this.adminKubeconfig)) {
        // DaemonSets first, or their pods come back
        try { await this.kubectl(['delete', 'daemonsets,deployments,jobs', '--all', '--all-namespaces', '--wait=false']); } catch { /* API down */ }
        try { await this.kubectl(['delete', 'pods', '--all', '--all-namespaces', '--grace-period=1', '--wait=false']); } catch { /* API down */ }
        // until no task runs: kubelet has stopped every container and torn
        // every sandbox down (CNI DEL); removing the exited containers is
        // kubelet's minute-long GC, which the state dir's removal replaces
        const end = Date.now() + 60_000;
        while (Date.now() < end) {
          let left = '';
          try { left = this.ctr('tasks', 'ls', '-q').trim(); } catch { break; }
          if (!left) break;
          await sleep(500);
        }
      }
    } finally {
      await this.cp.stopComponent('kubelet');
      await this.cp.stopComponent('containerd');
      try {
        beforeUnmount?.();
      } finally {
        this.detach();
      }
      cleanupNode(this.record, false);
    }
  }
}

/** Throws unless every path exists (for a failure message naming the missing image archive). */
export function requireFiles(files: string[], hint: string): void {
  const missing = files.filter((f) => !existsSync(f) || statSync(f).size === 0);
  if (missing.length) throw new Error(`missing ${missing.join(', ')}: ${hint}`);
}

export const REPO = repo;
