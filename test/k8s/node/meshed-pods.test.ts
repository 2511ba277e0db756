// meshcap deployed the way users deploy it, on a real node: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler (real TLS, per-run
// PKI and service-account keys), containerd v2 + runc and kubelet on this
// host (test/helpers/k8s-node.ts), the images of scripts/build-images.sh
// imported into containerd, and deploy/kustomize/base applied with kubectl
// through an overlay generated in the run's private dir (only image pull
// policy, host paths, loopback ports and the API server address are set
// there). Then pods created through the API:
//   - an Istio-style meshed pod: outbound to a server pod is carried by its
//     sidecar with the original destination, inbound to the app port lands
//     on 15006 with the original destination, 15021 is direct;
//   - an unmeshed pod and a meshed pod in an excluded namespace: untouched;
//   - pod deletion: DEL reaches the agent and its record is gone;
//   - `kubectl rollout restart` of the DaemonSet during a steady stream of
//     connections from a meshed pod: zero failed, zero uncaptured;
//   - the same pod checks with the agent forced to --mode=iptables;
//   - uninstall as docs/install.md says: DaemonSet deleted, then
//     deploy/uninstall-job.yaml: no chain entry, no pin, no agent state;
//   - teardown: nothing left (processes, mounts, cgroups, bridge, pins,
//     iptables rules, CNI files).
// Each check prints one line with its time and the components it started.
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { connect } from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { ControlPlane } from '../../helpers/k8s-control-plane.js';
import { KubeNode, NODE_IP, REPO, hostSnapshot, leftovers, nodeBuilt, requireFiles, type HostSnapshot } from '../../helpers/k8s-node.js';

const NODE = 'meshcap-node';
// MESHCAP_K8S_IMAGES: another dir with the same four archives (e.g. while build/images/ is being rebuilt)
const IMAGES = process.env.MESHCAP_K8S_IMAGES ?? path.join(REPO, 'build/images');
const ARCHIVES = ['pause', 'meshcap', 'app', 'sidecar'].map((i) => path.join(IMAGES, `${i}.tar`));
const PAUSE = 'localhost/pause:3.10.2';
const APP = 'localhost/meshcap-app:dev';
const SIDECAR = 'localhost/meshcap-sidecar:dev';
const BASE = path.join(REPO, 'deploy/kustomize/base');
const MESHED_NS = 'shop';
const EXCLUDED_NS = 'kube-system';

if (!nodeBuilt()) throw new Error('build/k8s/bin lacks the node binaries: run `bash scripts/build-k8s.sh --node` (npm run test:k8s does)');
requireFiles(ARCHIVES, 'run `bash scripts/build-images.sh` (npm run test:k8s does)');

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** One line per check: what it took and which components it started. */
const report: string[] = [];
function line(check: string, ms: number, started: string[] = []): void {
  const s = `k8s-node: ${check} (${(ms / 1000).toFixed(1)} s${started.length ? `; started ${started.join(', ')}` : ''})`;
  report.push(s);
  console.log(s);
}

/** One request line to ADDR:PORT from this host (the node), the server's one-line answer. */
function exchange(host: string, port: number, text: string, timeoutMs = 8000): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect({ host, port });
    let buf = '';
    const t = setTimeout(() => { s.destroy(); reject(new Error(`${host}:${port}: no answer in ${timeoutMs} ms`)); }, timeoutMs);
    s.on('connect', () => s.write(`${text}\n`));
    s.setEncoding('utf8').on('data', (d: string) => {
      buf += d;
      if (buf.includes('\n')) {
        clearTimeout(t);
        s.destroy();
        resolve(buf.trim());
      }
    });
    s.on('error', (e) => { clearTimeout(t); reject(new Error(`${host}:${port}: ${e.message}`)); });
  });
}

/** The app's answer: "<hostname> <local addr:port> <peer addr:port> TEXT". */
function answer(a: string): { host: string; local: string; peer: string; text: string } {
  const [host, local, peer, ...rest] = a.split(' ');
  return { host: host!, local: local!, peer: peer!, text: rest.join(' ') };
}

function httpGet(url: string): Promise<string> {
  return new Promise((resolve, reject) => {
    httpRequest(url, { timeout: 3000 }, (res) => {
      let b = '';
      res.setEncoding('utf8').on('data', (d: string) => { b += d; }).on('end', () => resolve(b));
    }).on('error', reject).on('timeout', function (this: { destroy(e: Error): void }) { this.destroy(new Error('timeout')); }).end();
  });
}

function counter(metrics: string, name: string, labels: Record<string, string>): number {
  let sum = 0;
  for (const l of metrics.split('\n')) {
    if (!l.startsWith(`${name}{`)) continue;
    if (Object.entries(labels).every(([k, v]) => l.includes(`${k}="${v}"`))) sum += Number(l.split(' ').pop());
  }
  return sum;
}

describe('meshcap on a real node (kubelet, containerd, the DaemonSet from deploy/)', () => {
  let before: HostSnapshot;
  let cp: ControlPlane;
  let node: KubeNode;
  let overlay: string;
  const agentPort = 20000 + Math.floor(Math.random() * 20000);
  const installPort = agentPort + 1;
  let runMeshcap: string;
  let netnsDir: string;

  /** The container's log lines (CRI log format stripped) from kubelet's pod log dir. */
  function containerLog(ns: string, pod: string, container: string): string[] {
    const dirs = readdirSync(node.podLogs).filter((d) => d.startsWith(`${ns}_${pod}_`));
    const out: string[] = [];
    for (const d of dirs) {
      const cdir = path.join(node.podLogs, d, container);
      if (!existsSync(cdir)) continue;
      for (const f of readdirSync(cdir).sort()) {
        for (const l of readFileSync(path.join(cdir, f), 'utf8').split('\n')) {
          const m = /^\S+ (?:stdout|stderr) [FP] (.*)$/.exec(l);
          if (m) out.push(m[1]!);
        }
      }
    }
    return out;
  }

  /** The sidecar's accepted connections ({"event":"accept",...} lines of the reference proxy). */
  function sidecarAccepts(ns: string, pod: string): { listener: string; orig: string; peer: string }[] {
    return containerLog(ns, pod, 'istio-proxy').flatMap((l) => {
      try {
        const e = JSON.parse(l) as { event?: string; listener: string; orig: string; peer: string };
        return e.event === 'accept' ? [e] : [];
      } catch { return []; }
    });
  }

  /**
   * The sidecar's accepts after the first `seen`, once one on `listener` with
   * `orig` is there: the container log reaches kubelet's file a little after
   * the connection (up to 10 s).
   */
  async function acceptsAfter(ns: string, pod: string, seen: number, listener: string, orig: string): Promise<{ listener: string; orig: string }[]> {
    const end = Date.now() + 10_000;
    for (;;) {
      const acc = sidecarAccepts(ns, pod).slice(seen).filter((e) => e.listener === listener);
      if (acc.some((e) => e.orig === orig) || Date.now() > end) return acc;
      await sleep(100);
    }
  }

  /** Time for a log line that should not come to reach the file if it came after all. */
  const QUIET_MS = 1500;

  function kustomization(mode: 'auto' | 'iptables'): void {
    // the base's DaemonSet, to patch its containers and volumes by index
    const docs = parseAllDocuments(readFileSync(path.join(BASE, 'meshcap.yaml'), 'utf8')).map((d) => d.toJS() as { kind?: string; spec?: never });
    const ds = docs.find((d) => d?.kind === 'DaemonSet') as unknown as {
      spec: { template: { spec: { containers: { name: string; args: string[]; volumeMounts?: { name: string; mountPath: string }[] }[]; volumes: { name: string; hostPath?: { path: string } }[] } } };
    };
    const pod = ds.spec.template.spec;
    const ops: object[] = [];
    const ci = (name: string) => {
      const i = pod.containers.findIndex((c) => c.name === name);
      if (i < 0) throw new Error(`the base DaemonSet has no ${name} container`);
      return i;
    };
    const setArg = (args: string[], flag: string, value: string) => {
      const i = args.findIndex((a) => a.startsWith(`${flag}=`));
      if (i < 0) throw new Error(`the base DaemonSet's args lack ${flag}`);
      args[i] = `${flag}=${value}`;
    };
    const probes = (i: number, port: number) => {
      for (const p of ['readinessProbe', 'livenessProbe']) {
        ops.push({ op: 'replace', path: `/spec/template/spec/containers/${i}/${p}/httpGet/port`, value: port });
        ops.push({ op: 'add', path: `/spec/template/spec/containers/${i}/${p}/httpGet/host`, value: '127.0.0.1' });
      }
      ops.push({ op: 'replace', path: `/spec/template/spec/containers/${i}/imagePullPolicy`, value: 'Never' });
    };
    const a = ci('agent');
    const agentArgs = [...pod.containers[a]!.args];
    setArg(agentArgs, '--metrics-addr', `127.0.0.1:${agentPort}`);
    setArg(agentArgs, '--mode', mode);
    ops.push({ op: 'replace', path: `/spec/template/spec/containers/${a}/args`, value: agentArgs });
    // no kube-proxy on this node: the agent (hostNetwork) reaches the API
    // server on loopback; in-cluster config reads these two
    ops.push({ op: 'add', path: `/spec/template/spec/containers/${a}/env/-`, value: { name: 'KUBERNETES_SERVICE_HOST', value: '127.0.0.1' } });
    ops.push({ op: 'add', path: `/spec/template/spec/containers/${a}/env/-`, value: { name: 'KUBERNETES_SERVICE_PORT', value: String(cp.apiserverPort) } });
    probes(a, agentPort);
    // containerd keeps this node's netns under its state dir: the agent sees
    // them at the path CNI_NETNS names
    const nm = pod.containers[a]!.volumeMounts!.findIndex((m) => m.name === 'netns');
    ops.push({ op: 'replace', path: `/spec/template/spec/containers/${a}/volumeMounts/${nm}/mountPath`, value: netnsDir });
    const ic = ci('install-cni');
    const icArgs = [...pod.containers[ic]!.args];
    setArg(icArgs, '--metrics-addr', `127.0.0.1:${installPort}`);
    // the path meshcap-cni (on the host) dials: the run-meshcap host path
    setArg(icArgs, '--agent-socket', path.join(runMeshcap, 'cni.sock'));
    ops.push({ op: 'replace', path: `/spec/template/spec/containers/${ic}/args`, value: icArgs });
    // install-cni asks the API server about its DaemonSet on SIGTERM (remove
    // the entry only when the DaemonSet is gone): the same loopback route
    ops.push({ op: 'add', path: `/spec/template/spec/containers/${ic}/env`, value: [
      { name: 'KUBERNETES_SERVICE_HOST', value: '127.0.0.1' }, { name: 'KUBERNETES_SERVICE_PORT', value: String(cp.apiserverPort) },
    ] });
    probes(ic, installPort);
    const hostPaths: Record<string, string> = {
      bpffs: node.bpffs, 'run-meshcap': runMeshcap, netns: netnsDir, 'cni-conf': node.cniConfDir, 'cni-bin': node.cniBin,
    };
    for (const [name, p] of Object.entries(hostPaths)) {
      const vi = pod.volumes.findIndex((v) => v.name === name);
      if (vi < 0) throw new Error(`the base DaemonSet has no ${name} volume`);
      ops.push({ op: 'replace', path: `/spec/template/spec/volumes/${vi}/hostPath/path`, value: p });
    }
    mkdirSync(overlay, { recursive: true });
    writeFileSync(path.join(overlay, 'kustomization.yaml'), [
      '# generated by test/k8s/node/meshed-pods.test.ts for one run',
      'apiVersion: kustomize.config.k8s.io/v1beta1',
      'kind: Kustomization',
      'resources:',
      `  - ${path.relative(overlay, BASE)}`,
      'images:',
      '  - name: localhost/meshcap',
      '    newName: localhost/meshcap',
      '    newTag: dev',
      'patches:',
      '  - target: {group: apps, version: v1, kind: DaemonSet, name: meshcap, namespace: meshcap-system}',
      `    patch: '${JSON.stringify(ops)}'`,
      '',
    ].join('\n'));
  }

  async function applyAndRollOut(mode: 'auto' | 'iptables'): Promise<void> {
    kustomization(mode);
    // the overlay lives in the run's dir, the base in the repository
    const rendered = await node.kubectl(['kustomize', '--load-restrictor', 'LoadRestrictionsNone', overlay]);
    await node.kubectl(['apply', '-f', '-'], rendered);
    await node.kubectl(['-n', 'meshcap-system', 'rollout', 'status', 'daemonset/meshcap', '--timeout=180s']);
  }

  async function agentMetrics(): Promise<string> {
    return httpGet(`http://127.0.0.1:${agentPort}/metrics`);
  }

  async function applyPod(p: object): Promise<void> {
    await node.kubectl(['apply', '-f', '-'], JSON.stringify(p));
  }

  /**
   * The app (meshcap-app) with, when meshed, an istio-proxy sidecar as uid
   * 1337 and Istio's status annotation. nativeSidecar: the proxy is an init
   * container with restartPolicy Always and a startup probe, so the app
   * starts once it listens (Istio's native sidecars do the same).
   */
  function appPod(ns: string, name: string, opts: { meshed?: boolean; nativeSidecar?: boolean; args?: string[]; restartPolicy?: string } = {}): object {
    const containers: object[] = [{
      name: 'app', image: APP, imagePullPolicy: 'Never', args: opts.args ?? ['serve', '--port', '8080', '--port', '15021'],
      ports: [{ containerPort: 8080 }],
    }];
    const sidecar = {
      name: 'istio-proxy', image: SIDECAR, imagePullPolicy: 'Never',
      securityContext: { runAsUser: 1337, runAsGroup: 1337 },
    };
    const initContainers: object[] = [];
    if (opts.meshed && opts.nativeSidecar) {
      initContainers.push({ ...sidecar, restartPolicy: 'Always', startupProbe: { tcpSocket: { port: 15001 }, periodSeconds: 1, failureThreshold: 60 } });
    } else if (opts.meshed) {
      containers.push(sidecar);
    }
    return {
      apiVersion: 'v1', kind: 'Pod',
      metadata: {
        name, namespace: ns, labels: { app: name },
        ...(opts.meshed ? { annotations: { 'sidecar.istio.io/status': JSON.stringify({ containers: ['istio-proxy'], initContainers: null, volumes: [] }) } } : {}),
      },
      spec: {
        automountServiceAccountToken: false, terminationGracePeriodSeconds: 2, restartPolicy: opts.restartPolicy ?? 'Always',
        ...(initContainers.length ? { initContainers } : {}),
        containers,
      },
    };
  }

  /** Waits for the reference proxy's {"event":"ready"} line (it listens on 15001 and 15006 then). */
  async function sidecarReady(ns: string, pod: string): Promise<void> {
    const end = Date.now() + 60_000;
    while (!containerLog(ns, pod, 'istio-proxy').some((l) => l.includes('"event":"ready"'))) {
      if (Date.now() > end) throw new Error(`${ns}/${pod}: the istio-proxy container (meshcap proxy) printed no ready line in 60 s`);
      await sleep(200);
    }
  }

  async function podIP(ns: string, name: string): Promise<string> {
    return (await node.kubectl(['-n', ns, 'get', 'pod', name, '-o', 'jsonpath={.status.podIP}'])).trim();
  }

  async function waitReady(ns: string, ...names: string[]): Promise<void> {
    await node.kubectl(['-n', ns, 'wait', '--for=condition=Ready', ...names.map((n) => `pod/${n}`), '--timeout=120s']);
  }

  function records(): { podName: string; podNamespace: string; mode: string; containerId: string }[] {
    const dir = path.join(runMeshcap, 'state');
    if (!existsSync(dir)) return [];
    return readdirSync(dir).filter((f) => f.endsWith('.json')).map((f) => JSON.parse(readFileSync(path.join(dir, f), 'utf8')));
  }

  beforeAll(async () => {
    before = hostSnapshot();
    let t = Date.now();
    cp = await ControlPlane.start({
      authorizationMode: 'Node,RBAC',
      apiserverArgs: ['--enable-admission-plugins', 'NodeRestriction', '--allow-privileged=true'],
    });
    await cp.startControllers();
    line('control plane up', Date.now() - t, ['etcd', 'kube-apiserver', 'kube-controller-manager', 'kube-scheduler']);
    t = Date.now();
    node = await KubeNode.start(cp, { nodeName: NODE, images: ARCHIVES, pauseImage: PAUSE });
    line(`node ${NODE} Ready (containerd ${node.startTimes.containerd} ms, ${ARCHIVES.length} images imported ${node.startTimes['image import']} ms, kubelet ${node.startTimes.kubelet} ms)`, Date.now() - t, ['containerd', 'kubelet']);
    overlay = path.join(cp.dir, 'deploy-overlay');
    // DIR/run stands for the host's /var/run (the uninstall Job removes DIR/run/meshcap)
    runMeshcap = path.join(cp.dir, 'run/meshcap');
    netnsDir = path.join(cp.dir, 'containerd/state/io.containerd.grpc.v1.cri/netns');
    mkdirSync(netnsDir, { recursive: true });
    for (const ns of [MESHED_NS]) await node.kubectl(['create', 'namespace', ns]);
  }, 300_000);

  afterAll(async () => {
    const rec = node?.record;
    const t = Date.now();
    let pinsLeft: string[] = [];
    try {
      await node?.stop(() => {
        // the uninstall Job (last test) unpinned everything; had it not run
        // or failed, unmounting the private bpffs drops the pins with it
        const pins = path.join(node.bpffs, 'meshcap');
        pinsLeft = existsSync(pins) ? readdirSync(pins).filter((e) => readdirSync(path.join(pins, e)).length > 0) : [];
      });
    } finally {
      await cp?.stop();
    }
    if (rec) {
      const left = leftovers(rec, before);
      if (pinsLeft.length) left.push(`pins under the private bpffs at teardown: ${pinsLeft.join(', ')}`);
      line(`teardown: ${left.length ? `LEFT BEHIND: ${left.join('; ')}` : 'nothing left (processes, mounts, cgroups, bridge, pins, iptables rules, CNI files)'}`, Date.now() - t);
      expect(left).toEqual([]);
    }
    console.log(report.join('\n'));
  }, 180_000);

  it('deploy/ applied with kubectl: the DaemonSet is Ready, install-cni chained meshcap-cni last into the node\'s conflist', async () => {
    // a meshed pod that starts before meshcap is on the node (issue 13: repair)
    await applyPod(appPod(MESHED_NS, 'early', { meshed: true }));
    await waitReady(MESHED_NS, 'early');
    const t = Date.now();
    await applyAndRollOut('auto');
    const conf = JSON.parse(readFileSync(path.join(node.cniConfDir, readdirSync(node.cniConfDir).find((f) => f.endsWith('.conflist'))!), 'utf8')) as { plugins: { type: string }[] };
    expect(conf.plugins.map((p) => p.type)).toEqual(['bridge', 'meshcap-cni']);
    expect(existsSync(path.join(node.cniBin, 'meshcap-cni'))).toBe(true);
    expect(await httpGet(`http://127.0.0.1:${agentPort}/readyz`)).toMatch(/ok|ready/i);
    line('DaemonSet meshcap Ready via kubectl apply (kustomize overlay), meshcap-cni chained by install-cni', Date.now() - t, ['meshcap agent', 'meshcap install-cni']);
  }, 240_000);

  it('a meshed pod started before meshcap was installed is repaired in place: record, Event, inbound through its sidecar', async () => {
    await withDiagnostics([[MESHED_NS, 'early']], async () => {
      const t = Date.now();
      const end = Date.now() + 60_000;
      while (!records().some((r) => r.podName === 'early') && Date.now() < end) await sleep(300);
      expect(records().map((r) => r.podName), 'the repaired pod\'s record').toContain('early');
      const events = JSON.parse(await node.kubectl(['-n', MESHED_NS, 'get', 'events', '--field-selector', 'involvedObject.name=early', '-o', 'json'])) as { items: { reason: string; message: string }[] };
      expect(events.items.map((e) => e.reason), JSON.stringify(events.items.map((e) => e.message))).toContain('MeshcapRepaired');
      await sidecarReady(MESHED_NS, 'early');
      const ip = await podIP(MESHED_NS, 'early');
      const inb = answer(await exchange(ip, 8080, 'early-in'));
      expect(inb.peer.startsWith('127.0.0.6:'), `the app saw ${inb.peer}: not through the sidecar`).toBe(true);
      line(`repair: meshed pod started before meshcap captured in place (record, MeshcapRepaired Event, inbound via the sidecar: app saw ${inb.peer})`, Date.now() - t);
      await node.kubectl(['-n', MESHED_NS, 'delete', 'pod', 'early', '--wait=false']);
    });
  }, 120_000);

  it('the primary CNI rewrites its conflist: install-cni chains meshcap-cni back within 1 s', async () => {
    const file = path.join(node.cniConfDir, readdirSync(node.cniConfDir).find((f) => f.endsWith('.conflist'))!);
    const conf = JSON.parse(readFileSync(file, 'utf8')) as { plugins: { type: string }[] };
    const t = Date.now();
    // as a primary CNI's own installer does: its file back, meshcap's entry gone (temp file + rename)
    writeFileSync(`${file}.tmp`, JSON.stringify({ ...conf, plugins: conf.plugins.filter((p) => p.type !== 'meshcap-cni') }, null, 2));
    renameSync(`${file}.tmp`, file);
    let types: string[] = [];
    while (Date.now() - t < 5000) {
      try {
        types = (JSON.parse(readFileSync(file, 'utf8')) as { plugins: { type: string }[] }).plugins.map((p) => p.type);
      } catch { /* mid-rename */ }
      if (types.includes('meshcap-cni')) break;
      await sleep(20);
    }
    const ms = Date.now() - t;
    expect(types).toEqual(['bridge', 'meshcap-cni']);
    expect(ms, 're-inserted within 1 s').toBeLessThan(1000);
    expect(counter(await httpGet(`http://127.0.0.1:${installPort}/metrics`), 'meshcap_cni_config_reinsertions_total', {})).toBeGreaterThanOrEqual(1);
    line(`conflist rewritten by the primary CNI: meshcap-cni chained back in ${ms} ms (meshcap_cni_config_reinsertions_total counted it)`, ms);
  }, 60_000);

  /** What a failed check needs to be understood: the pods, their sidecars' and the agent's last log lines. */
  async function diagnostics(pods: [string, string][]): Promise<string> {
    const out = [await node.kubectl(['get', 'pods', '-A', '-o', 'wide'])];
    for (const [ns, pod] of pods) {
      for (const c of ['app', 'istio-proxy']) {
        const l = containerLog(ns, pod, c);
        if (l.length) out.push(`--- ${ns}/${pod} ${c} (last 15 of ${l.length} lines)\n${l.slice(-15).join('\n')}`);
      }
    }
    const agentPods = readdirSync(node.podLogs).filter((d) => d.startsWith('meshcap-system_'));
    for (const d of agentPods) {
      const l = containerLog('meshcap-system', d.split('_')[1]!, 'agent');
      out.push(`--- agent ${d} (last 25 lines)\n${l.slice(-25).join('\n')}`);
    }
    return out.join('\n');
  }

  /** Runs a check; on failure prints the diagnostics first. */
  async function withDiagnostics(pods: [string, string][], fn: () => Promise<void>): Promise<void> {
    try {
      await fn();
    } catch (err) {
      console.log(await diagnostics(pods));
      throw err;
    }
  }

  /** The pod checks of part 4 in the agent's current mode; pods get the suffix. */
  async function podChecks(mode: string, sfx: string): Promise<void> {
    await withDiagnostics([[MESHED_NS, `server-${sfx}`], [MESHED_NS, `meshed-${sfx}`], [MESHED_NS, `plain-${sfx}`], [EXCLUDED_NS, `excluded-${sfx}`]], () => podChecksIn(mode, sfx));
  }

  async function podChecksIn(mode: string, sfx: string): Promise<void> {
    let t = Date.now();
    const [server, meshed, plain, excluded] = [`server-${sfx}`, `meshed-${sfx}`, `plain-${sfx}`, `excluded-${sfx}`];
    await applyPod(appPod(MESHED_NS, server));
    await applyPod(appPod(MESHED_NS, meshed, { meshed: true }));
    await applyPod(appPod(MESHED_NS, plain));
    await applyPod(appPod(EXCLUDED_NS, excluded, { meshed: true }));
    await waitReady(MESHED_NS, server, meshed, plain);
    await waitReady(EXCLUDED_NS, excluded);
    await sidecarReady(MESHED_NS, meshed);
    await sidecarReady(EXCLUDED_NS, excluded);
    const ip = { server: await podIP(MESHED_NS, server), meshed: await podIP(MESHED_NS, meshed), plain: await podIP(MESHED_NS, plain), excluded: await podIP(EXCLUDED_NS, excluded) };
    for (const v of Object.values(ip)) expect(v).toMatch(/^198\.19\.0\.\d+$/);
    const rec = records().find((r) => r.podName === meshed);
    expect(rec, `agent record for ${meshed}`).toBeDefined();
    expect(rec!.mode).toBe(mode);
    line(`${mode}: server, meshed, unmeshed and excluded-namespace pods Running (${JSON.stringify(ip)})`, Date.now() - t, ['4 pods']);

    // outbound: the meshed app dials the server pod (asked over 15021, which
    // is not captured); the sidecar accepts it on 15001 with the original destination
    t = Date.now();
    const seen0 = sidecarAccepts(MESHED_NS, meshed).length;
    const out = await exchange(ip.meshed, 15021, `DIAL ${ip.server}:8080 out-${sfx}`);
    expect(out).toMatch(/^DIALED /);
    const served = answer(out.replace(/^DIALED /, ''));
    expect(served.local).toBe(`${ip.server}:8080`);
    expect(served.peer.startsWith(`${ip.meshed}:`)).toBe(true);
    const outAcc = await acceptsAfter(MESHED_NS, meshed, seen0, 'outbound', `${ip.server}:8080`);
    expect(outAcc.map((e) => e.orig)).toContain(`${ip.server}:8080`);
    line(`${mode}: meshed pod -> server pod ${ip.server}:8080 carried by the sidecar (15001, original destination ${outAcc[0]?.orig})`, Date.now() - t);

    // inbound to the app port lands on 15006 with the original destination;
    // the sidecar passes it on from 127.0.0.6
    t = Date.now();
    const seen1 = sidecarAccepts(MESHED_NS, meshed).length;
    const inb = answer(await exchange(ip.meshed, 8080, `in-${sfx}`));
    expect(inb.peer.startsWith('127.0.0.6:')).toBe(true);
    const inAcc = await acceptsAfter(MESHED_NS, meshed, seen1, 'inbound', `${ip.meshed}:8080`);
    expect(inAcc.map((e) => e.orig)).toContain(`${ip.meshed}:8080`);
    line(`${mode}: node -> meshed pod :8080 landed on the sidecar's 15006 (original destination ${inAcc[0]?.orig}), app saw ${inb.peer}`, Date.now() - t);

    // 15021 is direct: the app sees the node's address, the sidecar nothing
    t = Date.now();
    const seen2 = sidecarAccepts(MESHED_NS, meshed).length;
    const health = answer(await exchange(ip.meshed, 15021, `health-${sfx}`));
    expect(health.peer.startsWith(`${NODE_IP}:`)).toBe(true);
    await sleep(QUIET_MS);
    expect(sidecarAccepts(MESHED_NS, meshed).slice(seen2)).toEqual([]);
    line(`${mode}: node -> meshed pod :15021 direct (app saw ${health.peer})`, Date.now() - t);

    // untouched: an unmeshed pod, and a meshed pod in an excluded namespace
    t = Date.now();
    const p1 = answer(await exchange(ip.plain, 8080, `plain-${sfx}`));
    expect(p1.peer.startsWith(`${NODE_IP}:`)).toBe(true);
    const p2 = await exchange(ip.plain, 15021, `DIAL ${ip.server}:8080 plain-out-${sfx}`);
    expect(answer(p2.replace(/^DIALED /, '')).peer.startsWith(`${ip.plain}:`)).toBe(true);
    const e1 = answer(await exchange(ip.excluded, 8080, `excluded-${sfx}`));
    expect(e1.peer.startsWith(`${NODE_IP}:`)).toBe(true);
    const e2 = await exchange(ip.excluded, 15021, `DIAL ${ip.server}:8080 excluded-out-${sfx}`);
    expect(e2).toMatch(/^DIALED /);
    await sleep(QUIET_MS);
    expect(sidecarAccepts(EXCLUDED_NS, excluded)).toEqual([]);
    expect(records().map((r) => r.podName)).not.toContain(plain);
    expect(records().map((r) => r.podName)).not.toContain(excluded);
    line(`${mode}: unmeshed pod and meshed pod in ${EXCLUDED_NS} untouched (direct both ways, no record, their sidecar saw nothing)`, Date.now() - t);

    // deletion: DEL reaches the agent, the record goes
    t = Date.now();
    const dels0 = counter(await agentMetrics(), 'meshcap_cni_requests_total', { verb: 'DEL' });
    await node.kubectl(['-n', MESHED_NS, 'delete', 'pod', meshed, '--wait=true', '--timeout=60s']);
    const end = Date.now() + 30_000;
    while (records().some((r) => r.podName === meshed) && Date.now() < end) await sleep(200);
    expect(records().map((r) => r.podName)).not.toContain(meshed);
    const dels = counter(await agentMetrics(), 'meshcap_cni_requests_total', { verb: 'DEL' }) - dels0;
    expect(dels).toBeGreaterThanOrEqual(1);
    line(`${mode}: pod deletion: DEL reached meshcap (${dels} DEL), the pod's record is gone`, Date.now() - t);
    await node.kubectl(['-n', MESHED_NS, 'delete', 'pod', server, plain, '--wait=false']);
    await node.kubectl(['-n', EXCLUDED_NS, 'delete', 'pod', excluded, '--wait=false']);
  }

  it('eBPF mode: meshed outbound/inbound/15021, unmeshed and excluded untouched, DEL', async () => {
    await podChecks('ebpf', 'e');
  }, 300_000);

  it('kubectl rollout restart of the DaemonSet during a steady stream from a meshed pod: zero failed, zero uncaptured', async () => {
    let t = Date.now();
    // about 50 s: the rollout took 14–29 s here, and must end inside the stream
    const COUNT = 500;
    await applyPod(appPod(MESHED_NS, 'target'));
    await waitReady(MESHED_NS, 'target');
    const target = await podIP(MESHED_NS, 'target');
    await applyPod(appPod(MESHED_NS, 'streamer', { meshed: true, nativeSidecar: true, restartPolicy: 'Never', args: ['stream', `${target}:8080`, '--count', String(COUNT), '--interval-ms', '100'] }));
    // the restart starts once the stream is under way
    const end0 = Date.now() + 60_000;
    while (!containerLog(MESHED_NS, 'streamer', 'app').some((l) => l.startsWith('ok ')) && Date.now() < end0) await sleep(200);
    const tr = Date.now();
    await node.kubectl(['-n', 'meshcap-system', 'rollout', 'restart', 'daemonset/meshcap']);
    await node.kubectl(['-n', 'meshcap-system', 'rollout', 'status', 'daemonset/meshcap', '--timeout=180s']);
    const restartMs = Date.now() - tr;
    // the restart happened inside the stream: it had not ended when the new agent was Ready
    expect(containerLog(MESHED_NS, 'streamer', 'app').some((l) => l.includes('"event":"summary"')), 'the stream ended before the rollout did: make it longer').toBe(false);
    const end = Date.now() + 120_000;
    let summary: { ok: number; failed: number } | undefined;
    while (!summary && Date.now() < end) {
      const s = containerLog(MESHED_NS, 'streamer', 'app').find((l) => l.includes('"event":"summary"'));
      if (s) summary = JSON.parse(s) as { ok: number; failed: number };
      else await sleep(500);
    }
    expect(summary, 'the stream\'s summary line').toBeDefined();
    const fails = containerLog(MESHED_NS, 'streamer', 'app').filter((l) => l.startsWith('fail '));
    expect(fails).toEqual([]);
    expect(summary).toMatchObject({ ok: COUNT, failed: 0 });
    const capturedNow = () => sidecarAccepts(MESHED_NS, 'streamer').filter((e) => e.listener === 'outbound' && e.orig === `${target}:8080`).length;
    const endLog = Date.now() + 10_000;
    while (capturedNow() < COUNT && Date.now() < endLog) await sleep(200);
    const captured = capturedNow();
    expect(captured).toBe(COUNT);
    line(`rollout restart of the DaemonSet (${(restartMs / 1000).toFixed(1)} s) during ${COUNT} connections: ${summary!.failed} failed, ${COUNT - captured} uncaptured`, Date.now() - t, ['a new meshcap agent pod']);
    t = Date.now();
    await node.kubectl(['-n', MESHED_NS, 'delete', 'pod', 'streamer', 'target', '--wait=true', '--timeout=60s']);
  }, 300_000);

  it('iptables mode (--mode=iptables through the overlay): the same pod checks', async () => {
    const t = Date.now();
    await applyAndRollOut('iptables');
    line('DaemonSet rolled out with --mode=iptables', Date.now() - t, ['a new meshcap agent pod']);
    await podChecks('iptables', 'i');
  }, 400_000);

  it('uninstall as documented: DaemonSet deleted, deploy/uninstall-job.yaml run: the chain entry and every pin are gone', async () => {
    const t = Date.now();
    await node.kubectl(['-n', 'meshcap-system', 'delete', 'daemonset', 'meshcap', '--wait=true', '--timeout=60s']);
    const end = Date.now() + 60_000;
    while ((await node.kubectl(['-n', 'meshcap-system', 'get', 'pods', '-o', 'name'])).trim() && Date.now() < end) await sleep(500);
    // install-cni saw its DaemonSet deleted: it took meshcap-cni out of the chain, binary included, so new pods start
    const chain = JSON.parse(readFileSync(path.join(node.cniConfDir, readdirSync(node.cniConfDir).find((f) => f.endsWith('.conflist'))!), 'utf8')) as { plugins: { type: string }[] };
    expect(chain.plugins.map((p) => p.type), 'the chain right after the DaemonSet went').toEqual(['bridge']);
    expect(existsSync(path.join(node.cniBin, 'meshcap-cni'))).toBe(false);
    await applyPod(appPod(MESHED_NS, 'after', { meshed: true }));
    await waitReady(MESHED_NS, 'after');
    line('DaemonSet deleted: install-cni removed meshcap-cni from the chain and the bin dir; a new meshed pod starts (uncaptured)', Date.now() - t);
    await node.kubectl(['-n', MESHED_NS, 'delete', 'pod', 'after', '--wait=false']);
    // the Job's NODE_NAME placeholder, and the host paths and pull policy as in the overlay
    const job = parseAllDocuments(readFileSync(path.join(REPO, 'deploy/uninstall-job.yaml'), 'utf8').replaceAll('NODE_NAME', NODE))
      .map((d) => d.toJS()).find((d) => d?.kind === 'Job') as {
        metadata: { name: string; namespace: string };
        spec: { template: { spec: { initContainers: { imagePullPolicy?: string }[]; containers: { imagePullPolicy?: string }[]; volumes: { name: string; hostPath: { path: string } }[] } } };
      };
    const js = job.spec.template.spec;
    for (const c of [...js.initContainers, ...js.containers]) c.imagePullPolicy = 'Never';
    const hostPaths: Record<string, string> = {
      'cni-conf': node.cniConfDir, 'cni-bin': node.cniBin, bpffs: node.bpffs, 'run-meshcap': runMeshcap, run: path.dirname(runMeshcap),
    };
    for (const v of js.volumes) if (hostPaths[v.name]) v.hostPath.path = hostPaths[v.name]!;
    await node.kubectl(['apply', '-f', '-'], JSON.stringify(job));
    await node.kubectl(['-n', job.metadata.namespace, 'wait', '--for=condition=complete', `job/${job.metadata.name}`, '--timeout=120s']);
    const conf = JSON.parse(readFileSync(path.join(node.cniConfDir, readdirSync(node.cniConfDir).find((f) => f.endsWith('.conflist'))!), 'utf8')) as { plugins: { type: string }[] };
    expect(conf.plugins.map((p) => p.type)).toEqual(['bridge']);
    const pins = path.join(node.bpffs, 'meshcap');
    const left = existsSync(pins) ? readdirSync(pins).flatMap((d) => readdirSync(path.join(pins, d)).map((f) => `${d}/${f}`)) : [];
    expect(left).toEqual([]);
    expect(existsSync(runMeshcap)).toBe(false);
    line('uninstall: DaemonSet deleted, uninstall Job complete: conflist back to bridge only, no pin, no agent state', Date.now() - t, ['the uninstall Job']);
  }, 240_000);
});
