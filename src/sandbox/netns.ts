// The fallback runtime for machines without podman: each pod is a plain
// network namespace, and the sandbox itself plays the container runtime's
// part in CNI — it runs the same chain (bridge + host-local + meshcap-cni)
// with the same environment (CNI_ARGS with K8S_POD_NAMESPACE/K8S_POD_NAME).
// Namespaces and pod processes come from the lab (src/lab): `ip netns exec`,
// setpriv for the proxy uid.
import { mkdirSync } from 'node:fs';
import { abortable, type Cleanup } from './cleanup.js';
import { chainAdd, chainDel, resultIPv4, type ConfList, type CniRuntimeConf } from './cni-chain.js';
import { conflist, type SandboxPlan } from './plan.js';
import { inNetns, startProc, type Proc } from '../lab/process.js';
import { addNetns, delNetns, netnsPath } from '../lab/netns.js';
import { cniPluginDirs, deleteBridge, type PodHandle, type RunOpts, type Runtime } from './runtime.js';
import { cniBinary } from '../paths.js';
import path from 'node:path';

interface NetnsPod {
  handle: PodHandle;
  rt: CniRuntimeConf;
  result: Record<string, unknown> | undefined;
  procs: Proc[];
}

export const netnsName = (plan: SandboxPlan, pod: string) => `mcsb-${plan.id}-${pod}`;

export class NetnsRuntime implements Runtime {
  readonly kind = 'netns' as const;
  readonly description: string;
  private readonly list: ConfList;
  private readonly pods = new Map<string, NetnsPod>();
  private paths: string[] = [];

  constructor(private readonly plan: SandboxPlan, private readonly cleanup: Cleanup, why: string) {
    this.description = `plain network namespaces, the CNI chain run by the sandbox itself (${why})`;
    this.list = conflist(plan) as unknown as ConfList;
  }

  async prepare(): Promise<void> {
    this.paths = [...cniPluginDirs(), path.dirname(cniBinary)];
    mkdirSync(path.join(this.plan.runDir, 'ipam'), { recursive: true });
    this.cleanup.add(`bridge ${this.plan.bridge}`, () => deleteBridge(this.plan.bridge));
  }

  async createPod(name: string, signal?: AbortSignal): Promise<PodHandle> {
    const ns = netnsName(this.plan, name);
    const netns = netnsPath(ns);
    const rt: CniRuntimeConf = {
      containerId: `meshcap-sandbox-${this.plan.id}-${name}`,
      netns,
      ifname: 'eth0',
      args: `IgnoreUnknown=1;K8S_POD_NAMESPACE=${this.plan.namespace};K8S_POD_NAME=${name}`,
      paths: this.paths,
      timeoutMs: this.plan.deadlines.cniPlugin,
    };
    const pod: NetnsPod = { handle: { name, ip: '', netns, containerId: rt.containerId }, rt, result: undefined, procs: [] };
    // Registered first: an abort while `ip netns add` runs must still remove the namespace.
    this.pods.set(name, pod);
    this.cleanup.add(`pod ${name} (netns ${ns})`, () => this.deletePod(pod.handle));
    await abortable(addNetns(ns), signal);
    // Set before the ADD: a failed ADD still gets its DEL (the runtime's duty in the spec).
    pod.result = await abortable(chainAdd(this.list, rt), signal);
    pod.handle.ip = resultIPv4(pod.result);
    return pod.handle;
  }

  run(pod: PodHandle, container: string, cmd: string[], o: RunOpts = {}): Proc {
    const p = this.pods.get(pod.name);
    if (!p) throw new Error(`pod ${pod.name} does not exist`);
    const proc = startProc(`${pod.name}-${container}`, 'ip', inNetns(netnsName(this.plan, pod.name), cmd, o.uid !== undefined ? { uid: o.uid } : {}));
    p.procs.push(proc);
    return proc;
  }

  async deletePod(handle: PodHandle): Promise<void> {
    const pod = this.pods.get(handle.name);
    if (!pod) return;
    this.pods.delete(handle.name);
    await Promise.all(pod.procs.map((p) => p.stop(2000)));
    let delError: Error | undefined;
    try {
      await chainDel(this.list, pod.rt, pod.result);
    } catch (e) {
      delError = e as Error;
    }
    await delNetns(netnsName(this.plan, handle.name));
    if (delError) throw delError;
  }
}
