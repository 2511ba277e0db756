// The words meshcap shares with Istio and Linkerd, defined once: the two
// profiles, the container names that mark a meshed pod, the annotation and
// label keys, and how those meshes read values (Go's strconv.ParseBool, JSON
// objects). The meshed-pod test (src/kube/meshed.ts), the pod -> capture
// config converters (src/redirect/), the agent and the CNI protocol all read
// them from here, so a name cannot drift between the decision and the config.

/** The meshes meshcap captures for; each has its defaults in src/redirect/profiles.ts. */
export const MESH_PROFILES = ['istio', 'linkerd'] as const;
export type MeshProfile = (typeof MESH_PROFILES)[number];

export function isMeshProfile(v: unknown): v is MeshProfile {
  return (MESH_PROFILES as readonly unknown[]).includes(v);
}

// Containers (regular or native-sidecar init containers) by the names the
// injectors give them.
export const ISTIO_PROXY_CONTAINER = 'istio-proxy';
/** Its presence means the pod redirects itself (no CNI): istio-cni skips it too. */
export const ISTIO_INIT_CONTAINER = 'istio-init';
export const LINKERD_PROXY_CONTAINER = 'linkerd-proxy';
export const LINKERD_INIT_CONTAINER = 'linkerd-init';
/** The user Istio's proxy image runs as (ENVOY_USER's default in istio-iptables' root.go). */
export const ISTIO_PROXY_USER = 'istio-proxy';

/** istio/api annotation names (annotation/annotations.gen.go) that istio-cni reads. */
export const ISTIO_ANNOTATIONS = {
  inject: 'sidecar.istio.io/inject',
  /** Written by the injector: the pod was injected. */
  status: 'sidecar.istio.io/status',
  interceptionMode: 'sidecar.istio.io/interceptionMode',
  statusPort: 'status.sidecar.istio.io/port',
  includeOutboundIPRanges: 'traffic.sidecar.istio.io/includeOutboundIPRanges',
  excludeOutboundIPRanges: 'traffic.sidecar.istio.io/excludeOutboundIPRanges',
  includeInboundPorts: 'traffic.sidecar.istio.io/includeInboundPorts',
  excludeInboundPorts: 'traffic.sidecar.istio.io/excludeInboundPorts',
  includeOutboundPorts: 'traffic.sidecar.istio.io/includeOutboundPorts',
  excludeOutboundPorts: 'traffic.sidecar.istio.io/excludeOutboundPorts',
  excludeInterfaces: 'traffic.sidecar.istio.io/excludeInterfaces',
  kubevirtInterfaces: 'traffic.sidecar.istio.io/kubevirtInterfaces',
  rerouteVirtualInterfaces: 'istio.io/reroute-virtual-interfaces',
} as const;

export const ISTIO_LABELS = {
  /** The newer form of the inject switch; it wins over the annotation (istio-cni). */
  inject: 'sidecar.istio.io/inject',
  /** `ambient`: ztunnel handles the pod, there is no sidecar. */
  dataplaneMode: 'istio.io/dataplane-mode',
} as const;

/** linkerd2 annotation names (the injector's config.linkerd.io/* and the inject switch). */
export const LINKERD_ANNOTATIONS = {
  inject: 'linkerd.io/inject',
  skipInboundPorts: 'config.linkerd.io/skip-inbound-ports',
  skipOutboundPorts: 'config.linkerd.io/skip-outbound-ports',
  skipSubnets: 'config.linkerd.io/skip-subnets',
  proxyUid: 'config.linkerd.io/proxy-uid',
  proxyGid: 'config.linkerd.io/proxy-gid',
  inboundPort: 'config.linkerd.io/proxy-inbound-port',
  outboundPort: 'config.linkerd.io/proxy-outbound-port',
  adminPort: 'config.linkerd.io/proxy-admin-port',
  controlPort: 'config.linkerd.io/proxy-control-port',
} as const;

/**
 * Go's strconv.ParseBool, as Istio reads boolean flags, env values and
 * annotations: undefined when the value is not a boolean (each caller decides
 * what Istio does then: ignore it, treat it as false, or reject the flag).
 */
export function parseGoBool(value: string): boolean | undefined {
  switch (value) {
    case '1': case 't': case 'T': case 'TRUE': case 'true': case 'True':
      return true;
    case '0': case 'f': case 'F': case 'FALSE': case 'false': case 'False':
      return false;
    default:
      return undefined;
  }
}

/** A JSON object (not null, not an array): pod manifests, CNI configs and results. */
export function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
