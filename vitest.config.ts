import { defineConfig } from 'vitest/config';

// Three projects: pure unit tests run in parallel; privileged tests touch the
// real kernel (netns, cgroups, BPF, iptables) and run one file at a time so
// two files never race on the cgroup root's attach points; k8s tests run a
// real control plane (docs/kubernetes-e2e.md).
export default defineConfig({
  test: {
    projects: [
      {
        test: {
          name: 'unit',
          // the kernel-matrix runner's pure parts (job script, console
          // markers, modules.dep order, report parsing) belong to the suite too
          include: ['test/unit/**/*.test.ts', 'test/kernels/lib/**/*.test.mjs'],
          testTimeout: 20_000,
        },
      },
      {
        test: {
          name: 'privileged',
          // plus one real VM run of the matrix runner (5.10 + 6.1 smoke and
          // the verifier demo, a few minutes under TCG): CI's proof that
          // test:kernels works from a fresh clone; the full matrix is an hour
          include: ['test/privileged/**/*.test.ts', 'test/kernels/e2e/**/*.test.mjs'],
          fileParallelism: false,
          testTimeout: 120_000,
          hookTimeout: 120_000,
        },
      },
      {
        test: {
          name: 'faults',
          // docs/reliability.md: churn and leaks, hostile input (libFuzzer
          // on the forwarder, property tests), access. groupOrder 1: after
          // the other projects, so its agents never share the cgroup root's
          // attach points with a privileged file. npm run test:faults runs
          // the long variants (MESHCAP_FAULTS_LONG=1).
          include: ['test/faults/**/*.test.ts'],
          fileParallelism: false,
          sequence: { groupOrder: 1 },
          testTimeout: 600_000,
          hookTimeout: 120_000,
        },
      },
      {
        test: {
          name: 'k8s',
          // a private etcd + kube-apiserver (built by scripts/build-k8s.sh)
          // per file, on 127.0.0.1: the pod watch against the real API server
          include: ['test/k8s/**/*.test.ts'],
          exclude: ['test/k8s/node/**'],
          fileParallelism: false,
          testTimeout: 180_000,
          hookTimeout: 180_000,
        },
      },
      // a real node (containerd + kubelet, kube-controller-manager,
      // kube-scheduler, the DaemonSet from deploy/): only in
      // `npm run test:k8s` (MESHCAP_K8S_NODE=1), not in npm test
      // (docs/kubernetes-e2e.md: its builds and run time)
      ...(process.env.MESHCAP_K8S_NODE === '1' ? [{
        test: {
          name: 'k8s-node',
          include: ['test/k8s/node/**/*.test.ts'],
          fileParallelism: false,
          testTimeout: 400_000,
          hookTimeout: 300_000,
        },
      }] : []),
    ],
  },
});
