// The Helm chart rendered by the helm scripts/build-helm.sh builds from its Go
// module, for the deploy tests (test/k8s/deploy-chart.test.ts, test/k8s/deploy-manifests).
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { projectRoot } from '../../src/paths.js';

export const HELM = path.join(projectRoot, 'build/helm/bin/helm');
export const KUSTOMIZE = path.join(projectRoot, 'build/helm/bin/kustomize');

export function requireChartTools(): void {
  if (!existsSync(HELM) || !existsSync(KUSTOMIZE)) throw new Error(`${HELM} or ${KUSTOMIZE} is missing: run bash scripts/build-helm.sh (npm run setup does)`);
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Obj = { apiVersion: string; kind: string; metadata: { name: string; namespace?: string }; [k: string]: any };

/** Values sets every deploy test renders: each value of the chart moved at least once. */
export const VALUE_SETS: Record<string, string[]> = {
  defaults: [],
  linkerd: ['--set', 'profile=linkerd', '--set', 'excludeNamespaces={monitoring,ci}'],
  iptables: ['--set', 'mode=iptables', '--set', 'repair=label', '--set', 'cni.confFile=10-calico.conflist', '--set', 'nodeTaint=meshcap.io/not-ready'],
  delete: ['--set', 'repair=delete', '--set', 'mode=ebpf', '--set', 'cni.confDir=/etc/cni/multus/net.d', '--set', 'cni.binDir=/var/lib/cni/bin'],
  off: ['--set', 'repair=off', '--set', 'ports.agent=19964', '--set', 'ports.installCni=19965', '--set', 'image.repository=registry.example.com/meshcap', '--set', 'image.tag=0.1.0'],
};

export function render(args: string[], ns = 'meshcap-system'): Obj[] {
  const out = execFileSync(HELM, ['template', 'meshcap', path.join(projectRoot, 'deploy/helm/meshcap'), '--namespace', ns, ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  return parseAllDocuments(out).map((d) => d.toJS() as Obj).filter(Boolean);
}
