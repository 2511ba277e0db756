// vitest strips types without checking them, and the build typechecks src/
// only: this keeps the tests' own types honest (tsconfig.test.json).
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { expect, it } from 'vitest';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

it('src, test and scripts typecheck under tsconfig.test.json', async () => {
  const r = await execa(path.join(root, 'node_modules/.bin/tsc'), ['-p', path.join(root, 'tsconfig.test.json')], { cwd: root, reject: false });
  expect(r.stdout + r.stderr).toBe('');
  expect(r.exitCode).toBe(0);
}, 60_000);
