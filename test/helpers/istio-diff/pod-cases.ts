// Generated pods (fast-check) for the differential against istio-cni: the
// containers that decide whether a pod is meshed (istio-proxy as a container
// or native sidecar, istio-init, istio-validation, linkerd's), the proxy's
// args, env and securityContext, the inject label/annotation, the injector's
// status annotation, ambient's label, every traffic.sidecar.istio.io/*
// annotation, interceptionMode, proxy.istio.io/config, the pod's addresses
// (IPv4, IPv6, dual stack in either order) and the namespace.
import fc from 'fast-check';
import type { V1Container, V1Pod } from '@kubernetes/client-node';
import { POD_V4, POD_V6, type Family } from '../istio-peers.js';

export interface PodCase {
  namespace: string;
  excludeNamespaces: string[];
  pod: V1Pod;
  /** The addresses the main CNI plugin gave the pod, in its order. */
  podIPs: string[];
  /** The namespace whose addresses istio-cni sees (the kernel lists IPv4 first either way). */
  family: Family;
}

const boolText = fc.constantFrom('true', 'false', '1', '0', 'T', 'yes', '', 'enabled');
const ports = fc.oneof(
  fc.constantFrom('*', '', '80', '80,443', '15020', '8080, 9090', '80,', 'abc', '70000', '8000-8010', ' 80 '),
  fc.array(fc.integer({ min: 1, max: 65535 }), { minLength: 1, maxLength: 3 }).map((a) => a.join(',')),
);
const cidrs = fc.oneof(
  fc.constantFrom('*', '', '10.0.0.0/8', '10.0.0.0/8,2001:db8::/32', '127.0.0.1/32', '::1/128', '10.1.2.3/8', '1.2.3.4', '10.0.0.0/8,', 'abc', '0.0.0.0/0,::/0'),
  fc.array(fc.constantFrom('192.168.0.0/16', '198.18.0.0/15', 'fd00::/8', '172.16.0.0/12'), { minLength: 1, maxLength: 3 }).map((a) => a.join(',')),
);
const ifaces = fc.constantFrom('', 'eth1', 'net1,net2', 'averyveryverylongname', 'bad/name', 'eth0,', ' eth1');
const mode = fc.constantFrom('REDIRECT', 'TPROXY', 'tproxy', 'bogus', '');
const proxyConfig = fc.constantFrom('{"interceptionMode":"TPROXY"}', 'interceptionMode: TPROXY\nholdApplicationUntilProxyStarts: true', '{}', 'not yaml: [');

const ANN = {
  inject: 'sidecar.istio.io/inject',
  status: 'sidecar.istio.io/status',
  mode: 'sidecar.istio.io/interceptionMode',
  statusPort: 'status.sidecar.istio.io/port',
  proxyConfig: 'proxy.istio.io/config',
};
const TRAFFIC: Array<[string, fc.Arbitrary<string>]> = [
  ['traffic.sidecar.istio.io/includeOutboundIPRanges', cidrs],
  ['traffic.sidecar.istio.io/excludeOutboundIPRanges', cidrs],
  ['traffic.sidecar.istio.io/includeInboundPorts', ports],
  ['traffic.sidecar.istio.io/excludeInboundPorts', ports],
  ['traffic.sidecar.istio.io/includeOutboundPorts', ports],
  ['traffic.sidecar.istio.io/excludeOutboundPorts', ports],
  ['traffic.sidecar.istio.io/excludeInterfaces', ifaces],
  ['traffic.sidecar.istio.io/kubevirtInterfaces', ifaces],
  ['istio.io/reroute-virtual-interfaces', ifaces],
  [ANN.mode, mode],
  [ANN.statusPort, fc.constantFrom('15020', '', 'abc', '15020,15021')],
  [ANN.proxyConfig, proxyConfig],
  [ANN.inject, boolText],
];

const envVar = fc.oneof(
  fc.tuple(fc.constantFrom('ISTIO_META_DNS_CAPTURE', 'ISTIO_DUAL_STACK', 'INVALID_DROP', 'DISABLE_ENVOY'), boolText).map(([name, value]) => ({ name, value })),
  fc.constantFrom('ISTIO_META_DNS_CAPTURE', 'DISABLE_ENVOY').map((name) => ({ name, valueFrom: { fieldRef: { fieldPath: 'metadata.name' } } })),
);
const id = fc.constantFrom<number | undefined>(undefined, undefined, 0, 1337, 1000, 2102);

const proxyContainer = fc.record({
  args: fc.constantFrom<string[] | undefined>(undefined, ['proxy', 'sidecar', '--domain', 'x'], ['proxy', 'router'], ['proxy'], ['proxy', 'sidecar'], ['proxy', 'waypoint']),
  env: fc.array(envVar, { maxLength: 3 }),
  runAsUser: id,
  runAsGroup: id,
}).map(({ args, env, runAsUser, runAsGroup }): V1Container => ({
  name: 'istio-proxy',
  image: 'proxyv2',
  ...(args ? { args } : {}),
  ...(env.length ? { env } : {}),
  ...(runAsUser !== undefined || runAsGroup !== undefined ? { securityContext: { ...(runAsUser !== undefined ? { runAsUser } : {}), ...(runAsGroup !== undefined ? { runAsGroup } : {}) } } : {}),
}));

const addresses = fc.constantFrom<{ podIPs: string[]; family: Family }>(
  { podIPs: [POD_V4], family: 'v4' },
  { podIPs: [POD_V6], family: 'v6' },
  { podIPs: [POD_V4, POD_V6], family: 'dual' },
  { podIPs: [POD_V6, POD_V4], family: 'dual' },
);

export const podCase: fc.Arbitrary<PodCase> = fc.record({
  namespace: fc.constantFrom('default', 'default', 'team-a', 'kube-system', 'istio-system'),
  excludeNamespaces: fc.constantFrom<string[]>([], ['kube-system'], ['kube-system', 'team-a']),
  // istio-proxy: mostly a container, sometimes a native sidecar, sometimes absent
  proxyAs: fc.constantFrom('container', 'container', 'container', 'init', 'none'),
  proxy: proxyContainer,
  withInit: fc.integer({ min: 0, max: 9 }),
  linkerd: fc.constantFrom('none', 'none', 'none', 'none', 'proxy', 'init'),
  injected: fc.integer({ min: 0, max: 9 }),
  label: fc.option(boolText, { freq: 4 }),
  ambient: fc.integer({ min: 0, max: 9 }),
  traffic: fc.subarray(TRAFFIC, { maxLength: 6 }).chain((keys) =>
    keys.length === 0 ? fc.constant({}) : fc.tuple(...keys.map(([, arb]) => arb)).map((vals) => Object.fromEntries(keys.map(([k], i) => [k, vals[i] as string])))),
  addresses,
}).map((g): PodCase => {
  const containers: V1Container[] = [{ name: 'app', image: 'app' }];
  const initContainers: V1Container[] = [];
  if (g.proxyAs === 'container') containers.push(g.proxy);
  if (g.proxyAs === 'init') initContainers.push({ ...g.proxy, restartPolicy: 'Always' });
  // istio-init in 1 of 10 pods, istio-validation (the CNI's own check container) in 1 of 10
  if (g.withInit === 0) initContainers.unshift({ name: 'istio-init', image: 'proxyv2' });
  if (g.withInit === 1) initContainers.unshift({ name: 'istio-validation', image: 'proxyv2' });
  if (g.linkerd === 'proxy') containers.push({ name: 'linkerd-proxy', image: 'linkerd' });
  if (g.linkerd === 'init') initContainers.push({ name: 'linkerd-init', image: 'linkerd' });
  const annotations: Record<string, string> = { ...g.traffic };
  if (g.injected > 0) annotations[ANN.status] = '{"initContainers":null,"containers":["istio-proxy"]}';
  const labels: Record<string, string> = { app: 'x' };
  if (g.label !== null) labels['sidecar.istio.io/inject'] = g.label;
  if (g.ambient === 0) labels['istio.io/dataplane-mode'] = 'ambient';
  return {
    namespace: g.namespace,
    excludeNamespaces: g.excludeNamespaces,
    podIPs: g.addresses.podIPs,
    family: g.addresses.family,
    pod: {
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: { name: 'p', namespace: g.namespace, labels, annotations },
      spec: { containers, ...(initContainers.length ? { initContainers } : {}) },
      status: { podIPs: g.addresses.podIPs.map((ip) => ({ ip })) },
    },
  };
});
