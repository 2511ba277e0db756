// The pod as the agent keeps it: only the fields something in meshcap reads
// (the decision, the capture config, repair, events), in the V1Pod shape so
// every reader takes it unchanged. A node's pods come from the API server as
// whole objects (managedFields, every container's env, volumes, conditions:
// 5-20 KB of JSON each, several times that as JS objects); at 10,000 pods
// keeping them whole costs hundreds of MB. Strings many pods share (label and
// annotation values, container names, the namespace) are kept once, and so
// are whole parts that many pods have alike (a workload's labels, the mesh's
// annotations, the spec as the view keeps it: the same for every replica, and
// nearly the same for every sidecar pod of a mesh), frozen.
//
// What is kept, and who reads it:
// - metadata: name, namespace, uid, resourceVersion (change detection),
//   deletionTimestamp (repair), every label (small; inject/ambient/repair
//   labels), and only the annotations in mesh/vocabulary.ts (the decision
//   and the capture config read no others);
// - spec: nodeName, hostNetwork, hostUsers, every container's and init container's
//   name (the decision and its reasons list them), and for the mesh
//   containers (istio-proxy/-init, linkerd-proxy/-init) the first two args
//   (gateway vs sidecar), the env entries PROXY_ENV_READ lists and
//   securityContext.runAsUser/runAsGroup;
// - status: phase, podIP, podIPs.
// test/unit/kube/pod-view.test.ts checks that the view decides exactly as
// the whole object on generated pods.
import type { V1Container, V1EnvVar, V1Pod, V1PodSpec, V1PodStatus } from '@kubernetes/client-node';
import {
  ISTIO_ANNOTATIONS,
  ISTIO_INIT_CONTAINER,
  ISTIO_PROXY_CONTAINER,
  LINKERD_ANNOTATIONS,
  LINKERD_INIT_CONTAINER,
  LINKERD_PROXY_CONTAINER,
} from '../mesh/vocabulary.js';

/** The annotations anything in meshcap reads (the rest are dropped). */
export const KEPT_ANNOTATIONS: ReadonlySet<string> = new Set([...Object.values(ISTIO_ANNOTATIONS), ...Object.values(LINKERD_ANNOTATIONS)]);

/** The proxy env entries the decision and the Istio capture config read (src/decision/meshed.ts, src/redirect/pod.ts). */
export const PROXY_ENV_READ: ReadonlySet<string> = new Set(['DISABLE_ENVOY', 'ISTIO_META_DNS_CAPTURE', 'ISTIO_DUAL_STACK', 'INVALID_DROP']);

const MESH_CONTAINERS: ReadonlySet<string> = new Set([ISTIO_PROXY_CONTAINER, ISTIO_INIT_CONTAINER, LINKERD_PROXY_CONTAINER, LINKERD_INIT_CONTAINER]);

/**
 * A string of our own: a substring of a parsed file (a V8 sliced string)
 * would keep the whole file's text alive as long as the pod is cached.
 */
function own(s: string): string {
  return s.length < 13 ? s : (' ' + s).slice(1);
}

/**
 * Strings shared by many pods, kept once. Bounded: past `max` entries it
 * starts over (pods already cached keep their strings; only sharing with
 * later pods is lost), so values of pods long gone do not pile up.
 */
export class StringPool {
  private readonly strings = new Map<string, string>();
  constructor(private readonly max = 65_536) {}

  get size(): number {
    return this.strings.size;
  }

  get(s: string): string {
    const have = this.strings.get(s);
    if (have !== undefined) return have;
    if (this.strings.size >= this.max) this.strings.clear();
    const mine = own(s);
    this.strings.set(mine, mine);
    return mine;
  }
}

function deepFreeze<T>(o: T): T {
  if (typeof o === 'object' && o !== null && !Object.isFrozen(o)) {
    for (const v of Object.values(o)) deepFreeze(v);
    Object.freeze(o);
  }
  return o;
}

/**
 * Parts of views that are alike (by their JSON), kept once and frozen: a
 * shared part must not change under another pod. Bounded like StringPool.
 * At 10,000 Istio pods the spec views alone were ~1 KB each (11 objects).
 */
export class ShapePool {
  private readonly shapes = new Map<string, object>();
  constructor(private readonly max = 4096) {}

  get size(): number {
    return this.shapes.size;
  }

  get<T extends object>(part: T): T {
    const key = JSON.stringify(part);
    const have = this.shapes.get(key);
    if (have !== undefined) return have as T;
    if (this.shapes.size >= this.max) this.shapes.clear();
    this.shapes.set(key, deepFreeze(part));
    return part;
  }
}

const str = (v: unknown): v is string => typeof v === 'string';

/**
 * The compact view of `pod` (see the top of this file); a view given again
 * comes back equal. With `shapes`, its labels, annotations and spec may be
 * shared with other views, frozen.
 */
export function podView(pod: V1Pod, pool: StringPool, shapes?: ShapePool): V1Pod {
  const m = pod.metadata ?? {};
  const metadata: NonNullable<V1Pod['metadata']> = {};
  if (str(m.name)) metadata.name = own(m.name);
  if (str(m.namespace)) metadata.namespace = pool.get(m.namespace);
  if (str(m.uid)) metadata.uid = own(m.uid);
  if (str(m.resourceVersion)) metadata.resourceVersion = own(m.resourceVersion);
  if (m.deletionTimestamp) metadata.deletionTimestamp = m.deletionTimestamp;
  if (m.labels) {
    const labels: Record<string, string> = {};
    for (const [k, v] of Object.entries(m.labels)) labels[pool.get(k)] = str(v) ? pool.get(v) : v;
    metadata.labels = shapes ? shapes.get(labels) : labels;
  }
  if (m.annotations) {
    let annotations: Record<string, string> | undefined;
    for (const [k, v] of Object.entries(m.annotations)) {
      if (!KEPT_ANNOTATIONS.has(k)) continue;
      (annotations ??= {})[pool.get(k)] = str(v) ? pool.get(v) : v;
    }
    if (annotations) metadata.annotations = shapes ? shapes.get(annotations) : annotations;
  }
  const view: V1Pod = { metadata };
  if (pod.spec) {
    const spec = specView(pod.spec, pool);
    view.spec = shapes ? shapes.get(spec) : spec;
  }
  if (pod.status) view.status = statusView(pod.status, pool);
  return view;
}

function specView(s: V1PodSpec, pool: StringPool): V1PodSpec {
  const spec = {} as V1PodSpec;
  if (str(s.nodeName)) spec.nodeName = pool.get(s.nodeName);
  if (s.hostNetwork !== undefined) spec.hostNetwork = s.hostNetwork;
  if (s.hostUsers !== undefined) spec.hostUsers = s.hostUsers;
  if (s.initContainers !== undefined) spec.initContainers = Array.isArray(s.initContainers) ? s.initContainers.map((c) => containerView(c, pool)) : s.initContainers;
  if (s.containers !== undefined) spec.containers = Array.isArray(s.containers) ? s.containers.map((c) => containerView(c, pool)) : s.containers;
  return spec;
}

function containerView(c: V1Container, pool: StringPool): V1Container {
  if (typeof c !== 'object' || c === null) return c;
  const name = str(c.name) ? pool.get(c.name) : c.name;
  if (!MESH_CONTAINERS.has(name)) return { name };
  const out: V1Container = { name };
  // the decision reads args[0] and args[1] only (`proxy router` is a gateway)
  if (Array.isArray(c.args)) out.args = c.args.slice(0, 2).map((a) => (str(a) ? pool.get(a) : a));
  if (Array.isArray(c.env)) {
    const env: V1EnvVar[] = [];
    for (const e of c.env) {
      if (!e || !PROXY_ENV_READ.has(e.name)) continue;
      env.push(e.value === undefined ? { name: pool.get(e.name) } : { name: pool.get(e.name), value: str(e.value) ? pool.get(e.value) : e.value });
    }
    if (env.length > 0) out.env = env;
  }
  const sc = c.securityContext;
  if (sc && (sc.runAsUser !== undefined || sc.runAsGroup !== undefined)) {
    out.securityContext = {};
    if (sc.runAsUser !== undefined) out.securityContext.runAsUser = sc.runAsUser;
    if (sc.runAsGroup !== undefined) out.securityContext.runAsGroup = sc.runAsGroup;
  }
  return out;
}

function statusView(s: V1PodStatus, pool: StringPool): V1PodStatus {
  const status: V1PodStatus = {};
  if (str(s.phase)) status.phase = pool.get(s.phase);
  if (str(s.podIP)) status.podIP = own(s.podIP);
  if (Array.isArray(s.podIPs)) status.podIPs = s.podIPs.map((p) => (p && str(p.ip) ? { ip: own(p.ip) } : p));
  return status;
}
