// Every Istio golden vector (test/fixtures/istio, provenance in its README),
// byte for byte: capture vectors through the istio-iptables flag parser, CNI
// vectors through the istio-cni pod converter.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import type { V1Pod } from '@kubernetes/client-node';
import { splitList } from '../../../src/redirect/config.js';
import { parseIstioIptablesArgs } from '../../../src/redirect/flags.js';
import { istioPodToCaptureConfig } from '../../../src/redirect/pod.js';
import { renderIptables } from '../../../src/fallback-iptables/render.js';

interface VectorPodContainer { name: string; env?: Record<string, string>; securityContext?: { runAsUser?: number; runAsGroup?: number } }
interface Vector {
  kind: 'capture' | 'cni';
  name: string;
  ipv6: boolean;
  flags?: string[];
  env?: Record<string, string>;
  pod?: { name: string; namespace: string; annotations: Record<string, string>; labels: Record<string, string>; containers: VectorPodContainer[]; initContainers: VectorPodContainer[] };
  expected_v4: string;
  expected_v6: string | null;
}

const VECTORS_PATH = new URL('../../fixtures/istio/istio-iptables-vectors.json', import.meta.url);
const vectors = JSON.parse(readFileSync(VECTORS_PATH, 'utf8')) as Vector[];

function toV1Pod(p: NonNullable<Vector['pod']>): V1Pod {
  const c = (x: VectorPodContainer) => ({
    name: x.name,
    env: x.env ? Object.entries(x.env).map(([name, value]) => ({ name, value })) : undefined,
    securityContext: x.securityContext,
  });
  return {
    metadata: { name: p.name, namespace: p.namespace, annotations: p.annotations, labels: p.labels },
    spec: { containers: p.containers.map(c), initContainers: p.initContainers.map(c) },
  };
}

describe('Istio golden istio-iptables vectors', () => {
  it('has the 12 vectors the fixture README lists', () => {
    expect(vectors.filter((v) => v.kind === 'capture')).toHaveLength(7);
    expect(vectors.filter((v) => v.kind === 'cni')).toHaveLength(5);
  });

  for (const v of vectors) {
    it(`${v.kind}/${v.name}`, () => {
      const config = v.kind === 'capture'
        ? parseIstioIptablesArgs(v.flags ?? [], {
          env: v.env ?? {},
          enableIPv6: v.ipv6,
          lookupUser: () => undefined,
          // DNS_SERVERS_V4/V6 are config.go JSON names, not env vars: they stand for resolv.conf.
          dnsServersV4: splitList(v.env?.DNS_SERVERS_V4 ?? ''),
          dnsServersV6: splitList(v.env?.DNS_SERVERS_V6 ?? ''),
        }).config
        : istioPodToCaptureConfig(toV1Pod(v.pod!), { enableIPv6: v.ipv6 });
      const out = renderIptables(config);
      expect(out.v4).toBe(v.expected_v4);
      expect(out.v6).toBe(v.expected_v6);
    });
  }
});
