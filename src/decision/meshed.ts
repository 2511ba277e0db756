// The meshed-pod decision: does this pod get its traffic redirected to a
// sidecar, and with which profile?
//
// The Istio test follows istio-cni's sidecar-mode CmdAdd (cni/pkg/plugin/
// plugin.go + getK8sPodInfo in kubernetes.go), in the same order, so a pod
// that istio-cni would skip is skipped here too, for the same reason. The
// Linkerd test follows linkerd2-proxy-init's cni-plugin (cmdAdd).
//
// Deliberate differences, each safer for an operator:
// - interceptionMode NONE: istio-cni fails the ADD ("interceptionMode
//   invalid"); Istio's injector treats NONE as "capture nothing", so we report
//   the pod as not meshed. Any other unknown mode is left to the redirect
//   config parser, which rejects it with the annotation name.
// - hostNetwork pods share the node's network namespace and are never
//   redirected (the injector never injects them; the CNI is normally not even
//   called for them, but a reconcile loop may ask).
import type { V1Container, V1Pod } from '@kubernetes/client-node';
import {
  ISTIO_ANNOTATIONS,
  ISTIO_INIT_CONTAINER,
  ISTIO_LABELS,
  ISTIO_PROXY_CONTAINER,
  LINKERD_ANNOTATIONS,
  LINKERD_INIT_CONTAINER,
  LINKERD_PROXY_CONTAINER,
  parseGoBool,
  type MeshProfile,
} from '../mesh/vocabulary.js';

export type MeshDecision =
  | { meshed: true; profile: MeshProfile }
  | { meshed: false; reason: string };

export interface MeshedOptions {
  /** Namespaces whose pods are never redirected (istio-cni `exclude_namespaces`). */
  excludeNamespaces?: readonly string[];
}

/** istio-cni's Helm default for `cni.excludeNamespaces`. */
export const DEFAULT_EXCLUDE_NAMESPACES: readonly string[] = ['kube-system'];

/**
 * The reason a namespace is excluded, or undefined: the first test of ADD and
 * CHECK, asked once, before the agent waits for the pod object (istio-cni
 * checks this before fetching the pod, too). decideMeshed does not repeat it.
 */
export function namespaceExclusion(namespace: string, opts: MeshedOptions = {}): string | undefined {
  const excluded = opts.excludeNamespaces ?? DEFAULT_EXCLUDE_NAMESPACES;
  return excluded.includes(namespace) ? `namespace ${namespace} is excluded` : undefined;
}

/**
 * The pod's own tests, in istio-cni's order after the namespace (which the
 * agent asks first, with namespaceExclusion, before it has the pod).
 */
export function decideMeshed(pod: V1Pod): MeshDecision {
  if (pod.spec?.hostNetwork) {
    return notMeshed('pod uses hostNetwork: it shares the node network namespace and is never redirected');
  }

  // Init containers count too: istio-init is one, and since Kubernetes 1.28
  // the proxy itself may be a native sidecar (an init container with
  // restartPolicy Always).
  const containers = [...(pod.spec?.initContainers ?? []), ...(pod.spec?.containers ?? [])];
  const names = new Set(containers.map((c) => c.name));
  const annotations = pod.metadata?.annotations ?? {};

  const looksIstio = names.has(ISTIO_PROXY_CONTAINER) || names.has(ISTIO_INIT_CONTAINER) || ISTIO_ANNOTATIONS.status in annotations;
  if (looksIstio) return decideIstio(pod, containers, names);

  const looksLinkerd = names.has(LINKERD_PROXY_CONTAINER) || names.has(LINKERD_INIT_CONTAINER);
  if (looksLinkerd) return decideLinkerd(pod, names);

  const ambient = pod.metadata?.labels?.[ISTIO_LABELS.dataplaneMode];
  if (ambient === 'ambient') {
    return notMeshed(`pod is enrolled in Istio ambient mode (${ISTIO_LABELS.dataplaneMode}=ambient) and has no sidecar: ztunnel handles it`);
  }
  return notMeshed(`no ${ISTIO_PROXY_CONTAINER} or ${LINKERD_PROXY_CONTAINER} container (containers: ${listNames(names)})`);
}

function decideIstio(pod: V1Pod, containers: V1Container[], names: Set<string>): MeshDecision {
  const annotations = pod.metadata?.annotations ?? {};
  const labels = pod.metadata?.labels ?? {};

  if (names.has(ISTIO_INIT_CONTAINER)) {
    return notMeshed(`${ISTIO_INIT_CONTAINER} init container present: the init container configures redirection`);
  }

  const proxy = containers.find((c) => c.name === ISTIO_PROXY_CONTAINER);
  // istio-cni reads env values literally into a map, so the last entry of a
  // name wins; valueFrom entries have no value.
  const disableEnvoy = proxy?.env?.findLast((e) => e.name === 'DISABLE_ENVOY')?.value;
  if (disableEnvoy !== undefined && parseGoBool(disableEnvoy) === true) {
    return notMeshed(`DISABLE_ENVOY=${disableEnvoy} on the ${ISTIO_PROXY_CONTAINER} container: Envoy is not running`);
  }

  if (!proxy) {
    return notMeshed(`no ${ISTIO_PROXY_CONTAINER} container (containers: ${listNames(names)})`);
  }

  // `pilot-agent proxy router` is a gateway, not a sidecar.
  const args = proxy.args ?? [];
  if (args.length >= 2 && args[0] === 'proxy' && args[1] !== 'sidecar') {
    return notMeshed(`${ISTIO_PROXY_CONTAINER} runs as proxy type "${args[1]}", not a sidecar`);
  }

  // The label is the newer API and wins over the annotation, as in istio-cni.
  const fromLabel = ISTIO_LABELS.inject in labels;
  const inject = fromLabel ? labels[ISTIO_LABELS.inject] : annotations[ISTIO_ANNOTATIONS.inject];
  if (inject && parseGoBool(inject) === false) {
    return notMeshed(`${fromLabel ? 'label' : 'annotation'} ${ISTIO_ANNOTATIONS.inject}="${inject}" disables injection`);
  }

  if (!(ISTIO_ANNOTATIONS.status in annotations)) {
    return notMeshed(`annotation ${ISTIO_ANNOTATIONS.status} is missing: the pod was not injected by Istio`);
  }

  if (annotations[ISTIO_ANNOTATIONS.interceptionMode] === 'NONE') {
    return notMeshed(`annotation ${ISTIO_ANNOTATIONS.interceptionMode}=NONE: the proxy captures no traffic`);
  }

  return { meshed: true, profile: 'istio' };
}

function decideLinkerd(pod: V1Pod, names: Set<string>): MeshDecision {
  if (names.has(LINKERD_INIT_CONTAINER)) {
    return notMeshed(`${LINKERD_INIT_CONTAINER} init container present: the init container configures redirection`);
  }
  if (!names.has(LINKERD_PROXY_CONTAINER)) {
    return notMeshed(`no ${LINKERD_PROXY_CONTAINER} container (containers: ${listNames(names)})`);
  }
  const inject = pod.metadata?.annotations?.[LINKERD_ANNOTATIONS.inject];
  if (inject === 'disabled') {
    return notMeshed(`annotation ${LINKERD_ANNOTATIONS.inject}=disabled`);
  }
  return { meshed: true, profile: 'linkerd' };
}

function notMeshed(reason: string): MeshDecision {
  return { meshed: false, reason };
}

function listNames(names: Set<string>): string {
  return names.size ? [...names].sort().join(', ') : 'none';
}
