// The compact pod view the pod cache keeps (src/kube/pod-view.ts) must decide
// exactly as the whole object: generated pods with every annotation, label,
// container, env entry and status field the decision, the capture config and
// repair read (valid and invalid values, in any order, among fields nobody
// reads) give the same ADD decision, the same capture-config error, the same
// Istio warnings and the same repair verdict from the view as from the pod.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { V1Container, V1Pod } from '@kubernetes/client-node';
import { decideAdd } from '../../../src/decision/add.js';
import { decideMeshed } from '../../../src/decision/meshed.js';
import { podToCaptureConfig } from '../../../src/redirect/pod.js';
import { uncapturedPods, UNCAPTURED_LABEL } from '../../../src/agent/repair.js';
import { ISTIO_ANNOTATIONS, ISTIO_LABELS, LINKERD_ANNOTATIONS } from '../../../src/mesh/vocabulary.js';
import { podView, ShapePool, StringPool } from '../../../src/kube/pod-view.js';

const CONTAINER_NAMES = ['istio-proxy', 'istio-init', 'linkerd-proxy', 'linkerd-init', 'app', 'istio-validation', 'sidecar'];
const ANNOTATION_VALUES = ['', '*', 'true', 'false', 'enabled', 'disabled', 'NONE', 'REDIRECT', 'TPROXY', 'bogus', '15020', '8080,9090', '1-2', '4000-5000',
  '198.18.0.0/15', '198.18.0.0/15,2001:db8::/32', '127.0.0.1/32', '0.0.0.0/0', 'not-a-cidr', 'eth1', 'eth1,net2', 'x'.repeat(20), '1337', '0', '-1', 'abc',
  '{"containers":["istio-proxy"]}'];
const ENV_VALUES = ['true', 'false', '1', '0', 'T', 'yes', '', 'maybe'];

const annotationKeys = [...Object.values(ISTIO_ANNOTATIONS), ...Object.values(LINKERD_ANNOTATIONS), 'kubectl.kubernetes.io/last-applied-configuration', 'prometheus.io/scrape', 'istio.io/rev'];
const labelKeys = [ISTIO_LABELS.inject, ISTIO_LABELS.dataplaneMode, UNCAPTURED_LABEL, 'app', 'version'];
const labelValues = ['true', 'false', 'ambient', 'none', 'web', 'v1', 'enabled'];

const envEntry = fc.record({
  // the names the readers use, spelled out here: not taken from PROXY_ENV_READ, which this checks
  name: fc.constantFrom('DISABLE_ENVOY', 'ISTIO_META_DNS_CAPTURE', 'ISTIO_DUAL_STACK', 'INVALID_DROP', 'PILOT_CERT_PROVIDER', 'POD_NAME'),
  value: fc.option(fc.constantFrom(...ENV_VALUES), { nil: undefined }),
}).map(({ name, value }) => (value === undefined ? { name, valueFrom: { fieldRef: { fieldPath: 'metadata.name' } } } : { name, value }));

const container: fc.Arbitrary<V1Container> = fc.record({
  name: fc.constantFrom(...CONTAINER_NAMES),
  image: fc.constant('img'),
  args: fc.option(fc.array(fc.constantFrom('proxy', 'sidecar', 'router', 'waypoint', '--domain', 'x'), { maxLength: 4 }), { nil: undefined }),
  env: fc.option(fc.array(envEntry, { maxLength: 5 }), { nil: undefined }),
  securityContext: fc.option(fc.record({
    runAsUser: fc.option(fc.constantFrom(0, 1337, 2102, 1000), { nil: undefined }),
    runAsGroup: fc.option(fc.constantFrom(0, 1337, 2103), { nil: undefined }),
    privileged: fc.boolean(),
  }, { requiredKeys: [] }), { nil: undefined }),
  volumeMounts: fc.constant([{ name: 'v', mountPath: '/v' }]),
}, { requiredKeys: ['name'] });

const ips = fc.array(fc.constantFrom('198.18.0.5', '198.18.0.6', '2001:db8::5', '2001:db8::6', 'junk'), { maxLength: 3 });

const pod: fc.Arbitrary<V1Pod> = fc.record({
  namespace: fc.constantFrom('default', 'shop', 'kube-system'),
  annotations: fc.option(fc.dictionary(fc.constantFrom(...annotationKeys), fc.constantFrom(...ANNOTATION_VALUES), { maxKeys: 6 }), { nil: undefined }),
  labels: fc.option(fc.dictionary(fc.constantFrom(...labelKeys), fc.constantFrom(...labelValues), { maxKeys: 4 }), { nil: undefined }),
  hostNetwork: fc.option(fc.boolean(), { nil: undefined }),
  hostUsers: fc.option(fc.boolean(), { nil: undefined }),
  containers: fc.array(container, { maxLength: 3 }),
  initContainers: fc.option(fc.array(container, { maxLength: 2 }), { nil: undefined }),
  phase: fc.option(fc.constantFrom('Running', 'Pending', 'Succeeded'), { nil: undefined }),
  podIP: fc.option(fc.constantFrom('198.18.0.5', '2001:db8::5'), { nil: undefined }),
  podIPs: fc.option(ips, { nil: undefined }),
  deleting: fc.boolean(),
  uid: fc.option(fc.constantFrom('u-1', 'u-2'), { nil: undefined }),
}).map((g) => ({
  apiVersion: 'v1',
  kind: 'Pod',
  metadata: {
    name: 'p',
    namespace: g.namespace,
    ...(g.uid ? { uid: g.uid } : {}),
    resourceVersion: '42',
    ...(g.annotations ? { annotations: g.annotations } : {}),
    ...(g.labels ? { labels: g.labels } : {}),
    ...(g.deleting ? { deletionTimestamp: new Date(0) } : {}),
    managedFields: [{ manager: 'kubelet', operation: 'Update' }],
  },
  spec: {
    nodeName: 'node-a',
    ...(g.hostNetwork !== undefined ? { hostNetwork: g.hostNetwork } : {}),
    ...(g.hostUsers !== undefined ? { hostUsers: g.hostUsers } : {}),
    containers: g.containers,
    ...(g.initContainers ? { initContainers: g.initContainers } : {}),
    volumes: [{ name: 'v', emptyDir: {} }],
  },
  status: {
    ...(g.phase ? { phase: g.phase } : {}),
    ...(g.podIP ? { podIP: g.podIP } : {}),
    ...(g.podIPs ? { podIPs: g.podIPs.map((ip) => ({ ip })) } : {}),
    conditions: [{ type: 'Ready', status: 'True' }],
  },
}));

const prevResult = fc.option(fc.record({
  cniVersion: fc.constant('1.0.0'),
  interfaces: fc.constant([{ name: 'eth0', sandbox: '/var/run/netns/x' }]),
  ips: ips.map((a) => a.map((address) => ({ address: `${address}/24`, interface: 0 }))),
}), { nil: undefined });

/** What a function gives or throws, comparable. */
function outcome<T>(f: () => T): { ok: T } | { threw: string } {
  try {
    return { ok: f() };
  } catch (err) {
    return { threw: `${(err as Error).name}: ${(err as Error).message}` };
  }
}

function warnings(p: V1Pod, profile: 'istio' | 'linkerd'): { config: unknown; warned: string[] } | { threw: string } {
  const warned: string[] = [];
  const r = outcome(() => podToCaptureConfig(p, profile, { onWarning: (m) => warned.push(m) }));
  return 'ok' in r ? { config: r.ok, warned } : r;
}

describe('podView', () => {
  it('decides exactly as the whole pod (generated pods)', () => {
    // one shape pool for all runs, as the cache has: views share frozen parts,
    // so a reader that wrote into a view would throw here
    const shapes = new ShapePool();
    fc.assert(fc.property(pod, prevResult, fc.constantFrom('ebpf' as const, 'iptables' as const), (whole, prev, nodeMode) => {
      const view = podView(whole, new StringPool(), shapes);
      expect(outcome(() => decideMeshed(view))).toEqual(outcome(() => decideMeshed(whole)));
      expect(outcome(() => decideAdd(view, { nodeMode, prevResult: prev }))).toEqual(outcome(() => decideAdd(whole, { nodeMode, prevResult: prev })));
      for (const profile of ['istio', 'linkerd'] as const) expect(warnings(view, profile)).toEqual(warnings(whole, profile));
      for (const excl of [[], ['kube-system']]) {
        expect(outcome(() => uncapturedPods([view], [], excl).length)).toEqual(outcome(() => uncapturedPods([whole], [], excl).length));
      }
      expect(view.metadata?.uid).toBe(whole.metadata?.uid);
      expect(view.spec?.nodeName).toBe(whole.spec?.nodeName);
      // a view given again comes back equal (the cache may be handed one)
      expect(podView(view, new StringPool())).toEqual(view);
      expect(podView(view, new StringPool(), shapes)).toEqual(view);
    }), { numRuns: 1000 });
    expect(shapes.size).toBeGreaterThan(10);
  });

  it('keeps only what meshcap reads, and one copy of strings many pods share', () => {
    const pool = new StringPool();
    const status = JSON.stringify({ containers: ['istio-proxy'], volumes: ['a', 'b', 'c'], revision: 'default' });
    const mk = (name: string): V1Pod => ({
      metadata: {
        name,
        namespace: 'shop',
        labels: { app: 'web' },
        annotations: { [ISTIO_ANNOTATIONS.status]: JSON.parse(JSON.stringify(status)) as string, [LINKERD_ANNOTATIONS.inject]: 'enabled', 'kubectl.kubernetes.io/last-applied-configuration': 'x'.repeat(5000) },
        managedFields: [{ manager: 'kubelet' }],
      },
      spec: {
        containers: [
          { name: 'app', image: 'app:1', env: [{ name: 'DISABLE_ENVOY', value: 'true' }], ports: [{ containerPort: 80 }] },
          { name: 'istio-proxy', image: 'proxyv2', args: ['proxy', 'sidecar', '--domain', 'x'], env: [{ name: 'POD_NAME', value: name }, { name: 'ISTIO_DUAL_STACK', value: 'true' }], securityContext: { runAsUser: 1337, privileged: false } },
        ],
        volumes: [{ name: 'v' }],
      },
      status: { phase: 'Running', podIP: '198.18.0.5', conditions: [{ type: 'Ready', status: 'True' }] },
    });
    const a = podView(mk('a'), pool);
    const b = podView(mk('b'), pool);
    expect(a).toEqual({
      metadata: { name: 'a', namespace: 'shop', labels: { app: 'web' }, annotations: { [ISTIO_ANNOTATIONS.status]: status, [LINKERD_ANNOTATIONS.inject]: 'enabled' } },
      spec: { containers: [{ name: 'app' }, { name: 'istio-proxy', args: ['proxy', 'sidecar'], env: [{ name: 'ISTIO_DUAL_STACK', value: 'true' }], securityContext: { runAsUser: 1337 } }] },
      status: { phase: 'Running', podIP: '198.18.0.5' },
    });
    // the status annotation of both pods is one string (the pool's)
    expect(Object.is(a.metadata!.annotations![ISTIO_ANNOTATIONS.status], b.metadata!.annotations![ISTIO_ANNOTATIONS.status])).toBe(true);
  });

  it('keeps parts many pods have alike once, frozen, and apart what differs', () => {
    const strings = new StringPool();
    const shapes = new ShapePool();
    const mk = (name: string, version: string): V1Pod => ({
      metadata: { name, namespace: 'shop', uid: `uid-${name}`, labels: { app: 'web', version }, annotations: { [ISTIO_ANNOTATIONS.status]: '{}' } },
      spec: { nodeName: 'node-a', containers: [{ name: 'app', image: `app:${name}` }, { name: 'istio-proxy', args: ['proxy', 'sidecar'], securityContext: { runAsUser: 1337 } }] },
      status: { phase: 'Running', podIP: `198.18.0.${name.length}` },
    });
    const [a, b, c] = [podView(mk('a', 'v1'), strings, shapes), podView(mk('bb', 'v1'), strings, shapes), podView(mk('ccc', 'v2'), strings, shapes)];
    expect(a.spec).toBe(b.spec);
    expect(a.spec).toBe(c.spec); // the image is not in the view
    expect(a.metadata!.labels).toBe(b.metadata!.labels);
    expect(c.metadata!.labels).not.toBe(a.metadata!.labels);
    expect(c.metadata!.labels).toEqual({ app: 'web', version: 'v2' });
    expect(a.metadata!.annotations).toBe(c.metadata!.annotations);
    // each pod's own: its metadata, status and view object
    expect(a.metadata).not.toBe(b.metadata);
    expect(a.status).not.toBe(b.status);
    expect(Object.isFrozen(a.spec!.containers[1]!.args)).toBe(true);
    expect(() => { (a.spec!.containers[1]!.securityContext as { runAsUser: number }).runAsUser = 0; }).toThrow(TypeError);
    expect(b.spec!.containers[1]!.securityContext!.runAsUser).toBe(1337);
  });

  it('the shape pool starts over past its bound', () => {
    const shapes = new ShapePool(2);
    for (const v of ['a', 'b', 'c']) shapes.get({ v });
    expect(shapes.size).toBe(1);
    const d = { v: 'd' };
    expect(shapes.get(d)).toBe(d);
  });

  it('the string pool starts over past its bound', () => {
    const pool = new StringPool(3);
    for (const s of ['a', 'b', 'c', 'd']) pool.get(s);
    expect(pool.size).toBe(1);
    expect(pool.get('d')).toBe('d');
  });
});
