// The kernel-matrix machinery's own tests, separate from the root config's
// unit/privileged projects (test/kernels/ is plain .mjs run by node):
//   unit: pure parts, no VM, no root, about 2 s;
//   vm:   boots 5.10 and 6.1 in qemu (root, about 2 min under TCG).
import { defineConfig } from 'vitest/config';

const root = new URL('.', import.meta.url).pathname;

export default defineConfig({
  test: {
    projects: [
      { test: { name: 'kernels-unit', root, include: ['lib/**/*.test.mjs'] } },
      { test: { name: 'kernels-vm', root, include: ['e2e/**/*.test.mjs'], testTimeout: 900_000 } },
    ],
  },
});
