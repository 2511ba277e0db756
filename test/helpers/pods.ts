// Pod manifests for tests, shaped like what Istio's injector produces.
import type { V1Pod } from '@kubernetes/client-node';
import { podToCaptureConfig } from '../../src/redirect/pod.js';
import type { CaptureConfig } from '../../src/redirect/config.js';

export function istioPod(o: { name?: string; namespace?: string; annotations?: Record<string, string>; proxyEnv?: Record<string, string>; ips?: string[] } = {}): V1Pod {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      name: o.name ?? 'app',
      namespace: o.namespace ?? 'default',
      annotations: { 'sidecar.istio.io/status': '{"containers":["istio-proxy"]}', ...(o.annotations ?? {}) },
    },
    spec: {
      containers: [
        { name: 'app', image: 'app' },
        { name: 'istio-proxy', image: 'proxyv2', env: Object.entries(o.proxyEnv ?? {}).map(([name, value]) => ({ name, value })) },
      ],
    },
    status: { podIPs: (o.ips ?? []).map((ip) => ({ ip })) },
  };
}

export function istioCapture(o: Parameters<typeof istioPod>[0] & { ipv6?: boolean } = {}): CaptureConfig {
  return podToCaptureConfig(istioPod(o), 'istio', { enableIPv6: o.ipv6 ?? true });
}
