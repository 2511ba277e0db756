import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { loadKubeConfig } from '../../../src/kube/api-source.js';

const kubeconfig = (server: string) => `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "${server}"}
users:
- name: u
  user: {token: t0k3n}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`;

describe('loadKubeConfig', () => {
  let dir: string;
  const saved = { ...process.env };
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'meshcap-kc-'));
  });
  afterEach(async () => {
    process.env = { ...saved };
    await rm(dir, { recursive: true, force: true });
  });

  it('loads an explicit file', async () => {
    const f = join(dir, 'config');
    await writeFile(f, kubeconfig('https://198.18.0.1:6443'));
    expect(loadKubeConfig(f).getCurrentCluster()?.server).toBe('https://198.18.0.1:6443');
  });

  it('uses $KUBECONFIG when not in a pod', async () => {
    const f = join(dir, 'config');
    await writeFile(f, kubeconfig('https://198.18.0.2:6443'));
    delete process.env.KUBERNETES_SERVICE_HOST;
    process.env.KUBECONFIG = f;
    expect(loadKubeConfig().getCurrentCluster()?.server).toBe('https://198.18.0.2:6443');
  });

  it('refuses the silent localhost:8080 fallback when there are no credentials', () => {
    delete process.env.KUBERNETES_SERVICE_HOST;
    delete process.env.KUBECONFIG;
    process.env.HOME = dir; // no ~/.kube/config here
    expect(() => loadKubeConfig()).toThrow(/no Kubernetes credentials found/);
  });
});
