// The podman runtime: real containers on the chained CNI network.
//
// Everything podman writes goes under the run dir (private containers.conf
// via CONTAINERS_CONF, --root/--runroot, network config dir, file locks,
// events file), so the host's podman setup is never touched. No registry is
// reachable, so every container runs from the host's own root filesystem
// mounted as a throwaway overlay (`--rootfs /:O`): node, the project and the
// tools are all there, and nothing a container writes reaches the host.
//
// A pod is what Kubernetes makes of it: a sandbox ("pause") container that
// owns the network namespace — podman runs the CNI chain for it and passes
// K8S_POD_NAME=<its name>, plus the K8S_POD_NAMESPACE we put in CNI_ARGS —
// and the pod's containers joining that namespace (`--network container:`).
import { mkdirSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import { projectRoot } from '../paths.js';
import { abortable, type Cleanup } from './cleanup.js';
import { conflist, containersConf, type SandboxPlan } from './plan.js';
import { startProc, type Proc } from '../lab/process.js';
import { cleanCniCache, cniCacheSnapshot, cniPluginDirs, deleteBridge, type PodHandle, type RunOpts, type Runtime } from './runtime.js';

/**
 * `--rootfs` is a switch: the first argument after the options is then a root
 * directory instead of an image (":O" = a throwaway overlay over it), and
 * everything after it is the command. So it always comes last.
 */
const ROOTFS = ['--rootfs', '/:O'];

export interface PodmanInfo {
  version: string;
  major: number;
}

/** podman's version, or why this machine cannot run the podman sandbox. */
export async function probePodman(): Promise<PodmanInfo | { missing: string }> {
  const r = await execa('podman', ['--version'], { reject: false });
  if (r.exitCode !== 0) return { missing: 'podman is not installed (apt-get install podman containernetworking-plugins runc)' };
  const v = /(\d+)\.(\d+)\.(\d+)/.exec(r.stdout);
  if (!v) return { missing: `cannot read podman's version from "${r.stdout}"` };
  const major = Number(v[1]);
  // podman 5 removed the CNI backend (netavark only): meshcap-cni cannot be chained there.
  if (major < 3 || major >= 5) return { missing: `podman ${v[0]} has no CNI network backend (needs podman 3 or 4)` };
  if ((await execa('runc', ['--version'], { reject: false })).exitCode !== 0) return { missing: 'runc is not installed (apt-get install runc): crun fails on hybrid cgroup hosts' };
  return { version: v[0], major };
}

/** Bind mounts for what the overlaid root filesystem does not show (other file systems). */
function extraMounts(): string[] {
  const rootDev = statSync('/').dev;
  const want = [projectRoot, path.dirname(process.execPath)];
  const out: string[] = [];
  for (const d of want) if (statSync(d).dev !== rootDev) out.push('-v', `${d}:${d}:ro`);
  return out;
}

export class PodmanRuntime implements Runtime {
  readonly kind = 'podman' as const;
  readonly description: string;
  private readonly env: NodeJS.ProcessEnv;
  private readonly base: string[];
  private readonly mounts = extraMounts();
  private readonly containers = new Map<string, Set<string>>();
  private readonly procs = new Map<string, Proc[]>();
  private readonly deleted = new Set<string>();

  constructor(private readonly plan: SandboxPlan, private readonly cleanup: Cleanup, info: PodmanInfo) {
    this.description = `podman ${info.version} (runc, CNI backend), containers from the host's root filesystem (--rootfs /:O)`;
    this.env = {
      ...process.env,
      CONTAINERS_CONF: path.join(plan.runDir, 'containers.conf'),
      // podman appends these to its own IgnoreUnknown=1;K8S_POD_NAME=<container name>.
      CNI_ARGS: `K8S_POD_NAMESPACE=${plan.namespace}`,
    };
    this.base = [
      '--root', path.join(plan.runDir, 'podman-root'),
      '--runroot', path.join(plan.runDir, 'podman-run'),
      // vfs: nothing to mount for an image store that holds no images.
      '--storage-driver', 'vfs',
    ];
  }

  private podman(args: string[], signal?: AbortSignal) {
    return abortable(execa('podman', [...this.base, ...args], { env: this.env, reject: false, timeout: this.plan.deadlines.podman }), signal);
  }

  async prepare(): Promise<void> {
    const pluginDirs = cniPluginDirs();
    const netDir = path.join(this.plan.runDir, 'net.d');
    mkdirSync(netDir, { recursive: true });
    writeFileSync(path.join(this.plan.runDir, 'containers.conf'), containersConf(this.plan, pluginDirs));
    writeFileSync(path.join(netDir, `${this.plan.network}.conflist`), JSON.stringify(conflist(this.plan), null, 2));
    const cache = cniCacheSnapshot();
    this.cleanup.add(`CNI cache entries of ${this.plan.network}`, () => cleanCniCache(this.plan.network, cache));
    this.cleanup.add(`bridge ${this.plan.bridge}`, () => deleteBridge(this.plan.bridge));
    this.cleanup.add('every podman container of this run', () => this.removeAll());
  }

  async createPod(name: string, signal?: AbortSignal): Promise<PodHandle> {
    this.containers.set(name, new Set());
    this.procs.set(name, []);
    this.deleted.delete(name);
    this.cleanup.add(`pod ${name} (podman)`, () => this.deletePod({ name, ip: '', netns: '', containerId: '' }));
    const r = await this.podman(['run', '-d', '--name', name, '--hostname', name, '--network', this.plan.network, ...this.mounts, ...ROOTFS, 'sleep', 'infinity'], signal);
    if (r.exitCode !== 0) throw new Error(`podman could not start pod ${name} on network ${this.plan.network}: ${lastLines(r.stderr)} (meshcap sandbox --runtime netns runs the same chain without podman)`);
    const i = await this.podman(['inspect', name, '--format', '{{json .}}'], signal);
    if (i.exitCode !== 0) throw new Error(`podman inspect ${name}: ${lastLines(i.stderr)}`);
    // `podman inspect` answers a list even for one name.
    const [info] = JSON.parse(i.stdout) as { Id: string; NetworkSettings: { SandboxKey: string; Networks: Record<string, { IPAddress: string }> } }[];
    if (!info) throw new Error(`podman inspect ${name} returned nothing`);
    const ip = info.NetworkSettings.Networks[this.plan.network]?.IPAddress;
    if (!ip) throw new Error(`podman gave pod ${name} no address on ${this.plan.network}`);
    return { name, ip, netns: info.NetworkSettings.SandboxKey, containerId: info.Id };
  }

  run(pod: PodHandle, container: string, cmd: string[], o: RunOpts = {}): Proc {
    const cname = `${pod.name}-${container}`;
    this.containers.get(pod.name)?.add(cname);
    const args = [
      ...this.base, 'run', '--rm', '--name', cname, '--network', `container:${pod.name}`, ...this.mounts,
      ...(o.uid !== undefined ? ['--user', `${o.uid}:${o.uid}`] : []),
      ...ROOTFS, ...cmd,
    ];
    const p = startProc(cname, 'podman', args, { env: this.env });
    const list = this.procs.get(pod.name) ?? [];
    list.push(p);
    this.procs.set(pod.name, list);
    return p;
  }

  async deletePod(pod: PodHandle): Promise<void> {
    if (this.deleted.has(pod.name)) return;
    // The pod's containers first (they hold its network namespace), then the sandbox: that runs CNI DEL.
    const inner = [...(this.containers.get(pod.name) ?? [])];
    if (inner.length) {
      const r = await this.podman(['rm', '-f', '-i', '-t', '0', ...inner]);
      if (r.exitCode !== 0) throw new Error(`podman rm ${inner.join(' ')}: ${lastLines(r.stderr)}`);
    }
    await Promise.all((this.procs.get(pod.name) ?? []).map((p) => p.stop(2000)));
    const r = await this.podman(['rm', '-f', '-i', '-t', '0', pod.name]);
    if (r.exitCode !== 0) throw new Error(`podman rm ${pod.name} (its CNI DEL): ${lastLines(r.stderr)}`);
    this.deleted.add(pod.name);
  }

  /** Whatever is still there (an interrupted run): a few rounds, since a sandbox container cannot go before the containers in its namespace. */
  private async removeAll(): Promise<void> {
    for (let round = 0; round < 3; round++) {
      const ps = await this.podman(['ps', '-a', '-q']);
      if (ps.exitCode !== 0) throw new Error(`podman ps: ${lastLines(ps.stderr)}`);
      if (!ps.stdout.trim()) return;
      await this.podman(['rm', '-a', '-f', '-t', '0']);
    }
    const left = await this.podman(['ps', '-a', '--format', '{{.Names}}']);
    if (left.stdout.trim()) throw new Error(`podman containers left: ${left.stdout.trim().split('\n').join(', ')}`);
  }
}

export function lastLines(s: string, n = 4): string {
  const l = s.trim().split('\n').filter((x) => !/level=warning/.test(x));
  return l.slice(-n).join(' | ') || '(no output)';
}
