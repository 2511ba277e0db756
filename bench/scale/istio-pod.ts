// A pod as Istio's sidecar injector leaves it with istio-cni on (istio 1.2x,
// sidecar mode, the CNI plugin meshcap stands in for): the app container plus
// istio-validation and istio-proxy with their
// args, env, ports, probes, security contexts and volumes, and the labels and
// annotations the injector and a Deployment add. bench:scale --source api
// creates these in a real kube-apiserver, which adds its defaults and
// managedFields, so the agent's LIST and watch carry pods of the size a node
// of a real mesh serves (~8 KB of JSON each), not the two-container stubs of
// the pods file.

const PROXY_ENV: [string, string][] = [
  ['PILOT_CERT_PROVIDER', 'istiod'],
  ['CA_ADDR', 'istiod.istio-system.svc:15012'],
  ['PROXY_CONFIG', '{}'],
  ['ISTIO_META_POD_PORTS', '[{"containerPort":8080,"protocol":"TCP"}]'],
  ['ISTIO_META_APP_CONTAINERS', 'app'],
  ['GOMEMLIMIT', '1073741824'],
  ['GOMAXPROCS', '2'],
  ['ISTIO_META_CLUSTER_ID', 'Kubernetes'],
  ['ISTIO_META_NODE_NAME', 'bench-node'],
  ['ISTIO_META_INTERCEPTION_MODE', 'REDIRECT'],
  ['ISTIO_META_WORKLOAD_NAME', 'bench'],
  ['ISTIO_META_OWNER', 'kubernetes://apis/apps/v1/namespaces/bench/deployments/bench'],
  ['ISTIO_META_MESH_ID', 'cluster.local'],
  ['TRUST_DOMAIN', 'cluster.local'],
];

const ISTIO_STATUS = JSON.stringify({
  initContainers: ['istio-validation'],
  containers: ['istio-proxy'],
  volumes: ['workload-socket', 'credential-socket', 'workload-certs', 'istio-envoy', 'istio-data', 'istio-podinfo', 'istio-token', 'istiod-ca-cert'],
  imagePullSecrets: null,
  revision: 'default',
});

export function istioPod(name: string, namespace: string, nodeName: string): Record<string, unknown> {
  const fieldEnv = (n: string, fieldPath: string) => ({ name: n, valueFrom: { fieldRef: { apiVersion: 'v1', fieldPath } } });
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      name,
      namespace,
      labels: {
        app: 'bench',
        version: 'v1',
        'pod-template-hash': '6d9f8c7b5',
        'security.istio.io/tlsMode': 'istio',
        'service.istio.io/canonical-name': 'bench',
        'service.istio.io/canonical-revision': 'v1',
      },
      annotations: {
        'istio.io/rev': 'default',
        'kubectl.kubernetes.io/default-container': 'app',
        'kubectl.kubernetes.io/default-logs-container': 'app',
        'prometheus.io/path': '/stats/prometheus',
        'prometheus.io/port': '15020',
        'prometheus.io/scrape': 'true',
        'sidecar.istio.io/status': ISTIO_STATUS,
      },
    },
    spec: {
      nodeName,
      serviceAccountName: 'default',
      initContainers: [{
        name: 'istio-validation',
        image: 'docker.io/istio/proxyv2:1.24.0',
        args: ['istio-iptables', '-p', '15001', '-z', '15006', '-u', '1337', '-m', 'REDIRECT', '-i', '*', '-x', '', '-b', '*', '-d', '15090,15021,15020', '--log_output_level=default:info', '--run-validation', '--skip-rule-apply'],
        resources: { limits: { cpu: '2', memory: '1Gi' }, requests: { cpu: '100m', memory: '128Mi' } },
        securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] }, privileged: false, readOnlyRootFilesystem: true, runAsGroup: 1337, runAsNonRoot: true, runAsUser: 1337 },
      }],
      containers: [
        {
          name: 'app',
          image: 'registry.example/bench/app:1.0.0',
          ports: [{ containerPort: 8080, protocol: 'TCP' }],
          resources: { requests: { cpu: '50m', memory: '64Mi' } },
          readinessProbe: { httpGet: { path: '/app-health/app/readyz', port: 15020, scheme: 'HTTP' }, periodSeconds: 10 },
        },
        {
          name: 'istio-proxy',
          image: 'docker.io/istio/proxyv2:1.24.0',
          args: ['proxy', 'sidecar', '--domain', `${namespace}.svc.cluster.local`, '--proxyLogLevel=warning', '--proxyComponentLogLevel=misc:error', '--log_output_level=default:info'],
          env: [
            ...PROXY_ENV.map(([n, value]) => ({ name: n, value })),
            fieldEnv('POD_NAME', 'metadata.name'),
            fieldEnv('POD_NAMESPACE', 'metadata.namespace'),
            fieldEnv('INSTANCE_IP', 'status.podIP'),
            fieldEnv('SERVICE_ACCOUNT', 'spec.serviceAccountName'),
            fieldEnv('HOST_IP', 'status.hostIP'),
            { name: 'ISTIO_CPU_LIMIT', valueFrom: { resourceFieldRef: { divisor: '0', resource: 'limits.cpu' } } },
          ],
          ports: [{ containerPort: 15090, name: 'http-envoy-prom', protocol: 'TCP' }],
          readinessProbe: { failureThreshold: 4, httpGet: { path: '/healthz/ready', port: 15021, scheme: 'HTTP' }, periodSeconds: 15, timeoutSeconds: 3 },
          startupProbe: { failureThreshold: 600, httpGet: { path: '/healthz/ready', port: 15021, scheme: 'HTTP' }, periodSeconds: 1, timeoutSeconds: 3 },
          resources: { limits: { cpu: '2', memory: '1Gi' }, requests: { cpu: '100m', memory: '128Mi' } },
          securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] }, privileged: false, readOnlyRootFilesystem: true, runAsGroup: 1337, runAsNonRoot: true, runAsUser: 1337 },
          volumeMounts: [
            { mountPath: '/var/run/secrets/workload-spiffe-uds', name: 'workload-socket' },
            { mountPath: '/var/run/secrets/credential-uds', name: 'credential-socket' },
            { mountPath: '/var/run/secrets/workload-spiffe-credentials', name: 'workload-certs' },
            { mountPath: '/var/run/secrets/istio', name: 'istiod-ca-cert' },
            { mountPath: '/var/lib/istio/data', name: 'istio-data' },
            { mountPath: '/etc/istio/proxy', name: 'istio-envoy' },
            { mountPath: '/var/run/secrets/tokens', name: 'istio-token' },
            { mountPath: '/etc/istio/pod', name: 'istio-podinfo' },
          ],
        },
      ],
      volumes: [
        { name: 'workload-socket', emptyDir: {} },
        { name: 'credential-socket', emptyDir: {} },
        { name: 'workload-certs', emptyDir: {} },
        { name: 'istio-envoy', emptyDir: { medium: 'Memory' } },
        { name: 'istio-data', emptyDir: {} },
        { name: 'istio-podinfo', downwardAPI: { items: [{ fieldRef: { fieldPath: 'metadata.labels' }, path: 'labels' }, { fieldRef: { fieldPath: 'metadata.annotations' }, path: 'annotations' }] } },
        { name: 'istio-token', projected: { sources: [{ serviceAccountToken: { audience: 'istio-ca', expirationSeconds: 43200, path: 'istio-token' } }] } },
        { name: 'istiod-ca-cert', configMap: { name: 'istio-ca-root-cert' } },
      ],
    },
  };
}
