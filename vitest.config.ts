import { defineConfig } from 'vitest/config';

// Two projects: pure unit tests run in parallel; privileged tests touch the
// real kernel (netns, cgroups, BPF, iptables) and run one file at a time so
// two files never race on the cgroup root's attach points.
export default defineConfig({
  test: {
    projects: [
      {
        test: {
          name: 'unit',
          include: ['test/unit/**/*.test.ts'],
          testTimeout: 20_000,
        },
      },
      {
        test: {
          name: 'privileged',
          include: ['test/privileged/**/*.test.ts'],
          fileParallelism: false,
          testTimeout: 120_000,
          hookTimeout: 120_000,
        },
      },
    ],
  },
});
