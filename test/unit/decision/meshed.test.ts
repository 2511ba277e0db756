import { describe, expect, it } from 'vitest';
import type { V1Pod } from '@kubernetes/client-node';
import { decideMeshed, namespaceExclusion } from '../../../src/decision/meshed.js';

// A pod as Istio's injector leaves it in CNI mode: istio-validation init
// container, istio-proxy sidecar, sidecar.istio.io/status annotation.
function istioPod(): V1Pod {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      name: 'web-1',
      namespace: 'shop',
      annotations: { 'sidecar.istio.io/status': '{"initContainers":["istio-validation"],"containers":["istio-proxy"]}' },
      labels: { app: 'web' },
    },
    spec: {
      initContainers: [{ name: 'istio-validation', image: 'proxyv2' }],
      containers: [
        { name: 'app', image: 'web' },
        { name: 'istio-proxy', image: 'proxyv2', args: ['proxy', 'sidecar'], env: [{ name: 'ISTIO_META_DNS_CAPTURE', value: 'true' }] },
      ],
    },
  };
}

function linkerdPod(): V1Pod {
  return {
    metadata: { name: 'api-1', namespace: 'emojivoto', annotations: { 'linkerd.io/proxy-version': 'edge-25.1.1', 'linkerd.io/inject': 'enabled' } },
    spec: { containers: [{ name: 'linkerd-proxy', image: 'proxy' }, { name: 'app', image: 'api' }] },
  };
}

const proxy = (p: V1Pod) => p.spec!.containers.find((c) => c.name === 'istio-proxy')!;

type Case = [name: string, mutate: (p: V1Pod) => void, reason: RegExp];

describe('decideMeshed: istio', () => {
  it('meshes an injected pod', () => {
    expect(decideMeshed(istioPod())).toEqual({ meshed: true, profile: 'istio' });
  });

  it('meshes a pod whose istio-proxy is a native sidecar (init container)', () => {
    const p = istioPod();
    const sidecar = p.spec!.containers.splice(1, 1)[0]!;
    p.spec!.initContainers!.push({ ...sidecar, restartPolicy: 'Always' });
    expect(decideMeshed(p)).toEqual({ meshed: true, profile: 'istio' });
  });

  const cases: Case[] = [
    ['istio-init init container', (p) => { p.spec!.initContainers = [{ name: 'istio-init' }]; }, /^istio-init init container present: the init container configures redirection$/],
    ['DISABLE_ENVOY=true', (p) => { proxy(p).env!.push({ name: 'DISABLE_ENVOY', value: 'true' }); }, /DISABLE_ENVOY=true on the istio-proxy container/],
    ['DISABLE_ENVOY=1 (Go ParseBool)', (p) => { proxy(p).env!.push({ name: 'DISABLE_ENVOY', value: '1' }); }, /DISABLE_ENVOY=1/],
    ['no istio-proxy container', (p) => { p.spec!.containers = [{ name: 'app' }]; }, /^no istio-proxy container \(containers: app, istio-validation\)$/],
    ['gateway proxy type', (p) => { proxy(p).args = ['proxy', 'router']; }, /proxy type "router", not a sidecar/],
    ['inject annotation false', (p) => { p.metadata!.annotations!['sidecar.istio.io/inject'] = 'false'; }, /^annotation sidecar.istio.io\/inject="false" disables injection$/],
    ['inject label false wins over annotation true', (p) => { p.metadata!.annotations!['sidecar.istio.io/inject'] = 'true'; p.metadata!.labels!['sidecar.istio.io/inject'] = 'false'; }, /^label sidecar.istio.io\/inject="false"/],
    ['status annotation missing', (p) => { delete p.metadata!.annotations!['sidecar.istio.io/status']; }, /annotation sidecar.istio.io\/status is missing/],
    ['interceptionMode NONE', (p) => { p.metadata!.annotations!['sidecar.istio.io/interceptionMode'] = 'NONE'; }, /interceptionMode=NONE/],
    ['hostNetwork', (p) => { p.spec!.hostNetwork = true; }, /hostNetwork/],
  ];
  for (const [name, mutate, reason] of cases) {
    it(`not meshed: ${name}`, () => {
      const p = istioPod();
      mutate(p);
      const d = decideMeshed(p);
      expect(d.meshed).toBe(false);
      expect(d.meshed === false && d.reason).toMatch(reason);
    });
  }

  it('values that do not flip the decision', () => {
    const keep: Array<(p: V1Pod) => void> = [
      (p) => { p.metadata!.annotations!['sidecar.istio.io/inject'] = 'true'; },
      // Not a Go boolean: istio-cni ignores it.
      (p) => { p.metadata!.annotations!['sidecar.istio.io/inject'] = 'no'; },
      // Label true wins over annotation false.
      (p) => { p.metadata!.annotations!['sidecar.istio.io/inject'] = 'false'; p.metadata!.labels!['sidecar.istio.io/inject'] = 'true'; },
      (p) => { proxy(p).env!.push({ name: 'DISABLE_ENVOY', value: 'false' }); },
      (p) => { proxy(p).env!.push({ name: 'DISABLE_ENVOY', value: 'yes' }); },
      (p) => { p.metadata!.annotations!['sidecar.istio.io/interceptionMode'] = 'TPROXY'; },
      (p) => { proxy(p).args = ['proxy', 'sidecar', '--domain', 'x']; },
      (p) => { delete proxy(p).args; },
      (p) => { delete p.metadata!.namespace; }, // "default" is not excluded
    ];
    for (const mutate of keep) {
      const p = istioPod();
      mutate(p);
      expect(decideMeshed(p)).toEqual({ meshed: true, profile: 'istio' });
    }
  });

  it('excludes namespaces by the configured list instead of the default, in namespaceExclusion only', () => {
    expect(namespaceExclusion('shop', { excludeNamespaces: ['shop'] })).toBe('namespace shop is excluded');
    expect(namespaceExclusion('kube-system', { excludeNamespaces: [] })).toBeUndefined();
    const ks = istioPod();
    ks.metadata!.namespace = 'kube-system';
    expect(decideMeshed(ks), 'the pod tests do not repeat the namespace test').toEqual({ meshed: true, profile: 'istio' });
    expect(namespaceExclusion('kube-system')).toBe('namespace kube-system is excluded');
    expect(namespaceExclusion('shop')).toBeUndefined();
  });
});

describe('decideMeshed: linkerd', () => {
  it('meshes a pod with linkerd-proxy', () => {
    expect(decideMeshed(linkerdPod())).toEqual({ meshed: true, profile: 'linkerd' });
  });
  it('meshes a native-sidecar linkerd-proxy', () => {
    const p = linkerdPod();
    p.spec!.initContainers = p.spec!.containers.splice(0, 1).map((c) => ({ ...c, restartPolicy: 'Always' }));
    expect(decideMeshed(p)).toEqual({ meshed: true, profile: 'linkerd' });
  });
  it('not meshed with linkerd-init', () => {
    const p = linkerdPod();
    p.spec!.initContainers = [{ name: 'linkerd-init' }];
    expect(decideMeshed(p)).toEqual({ meshed: false, reason: 'linkerd-init init container present: the init container configures redirection' });
  });
  it('not meshed with linkerd.io/inject=disabled', () => {
    const p = linkerdPod();
    p.metadata!.annotations!['linkerd.io/inject'] = 'disabled';
    expect(decideMeshed(p)).toEqual({ meshed: false, reason: 'annotation linkerd.io/inject=disabled' });
  });
});

describe('decideMeshed: plain pods', () => {
  it('names the containers it saw', () => {
    const p: V1Pod = { metadata: { name: 'x', namespace: 'a' }, spec: { containers: [{ name: 'nginx' }] } };
    expect(decideMeshed(p)).toEqual({ meshed: false, reason: 'no istio-proxy or linkerd-proxy container (containers: nginx)' });
  });
  it('explains ambient pods', () => {
    const p: V1Pod = { metadata: { name: 'x', namespace: 'a', labels: { 'istio.io/dataplane-mode': 'ambient' } }, spec: { containers: [{ name: 'nginx' }] } };
    const d = decideMeshed(p);
    expect(d.meshed === false && d.reason).toMatch(/ambient mode .* ztunnel handles it/);
  });
  it('copes with an empty pod', () => {
    expect(decideMeshed({})).toEqual({ meshed: false, reason: 'no istio-proxy or linkerd-proxy container (containers: none)' });
  });
});
