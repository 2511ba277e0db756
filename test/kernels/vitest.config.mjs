// The kernel-matrix machinery's own tests (pure: no VM, no root). Separate
// from the root config's unit/privileged projects because test/kernels/ is
// plain .mjs run by node, not part of the TypeScript tree.
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    root: new URL('.', import.meta.url).pathname,
    include: ['lib/**/*.test.mjs'],
  },
});
