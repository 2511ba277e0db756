// A new user's first step, for real: `git clone` of the committed HEAD into an
// empty temporary directory, build it there and run the unit project inside
// that clone. Anything the tests open outside the repository (a sibling
// directory, the workspace) is absent around the clone, so the run fails.
// node_modules is a symlink to this checkout's: installing would need the
// network, and the dependencies are not what this test is about. The build
// runs in the clone (about 30 s), so its BPF objects and addon come from the
// cloned sources, not from this checkout's work tree.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { expect, it } from 'vitest';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const self = path.relative(root, fileURLToPath(import.meta.url));

it('the committed HEAD, cloned into an empty directory, builds and passes the unit project there', async () => {
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-clone-'));
  try {
    const clone = path.join(tmp, 'meshcap');
    execFileSync('git', ['clone', '--quiet', '--no-hardlinks', root, clone]);
    expect(execFileSync('git', ['rev-parse', 'HEAD'], { cwd: clone, encoding: 'utf8' }))
      .toBe(execFileSync('git', ['rev-parse', 'HEAD'], { cwd: root, encoding: 'utf8' }));
    expect(existsSync(path.join(clone, 'node_modules')), 'node_modules is not tracked').toBe(false);
    symlinkSync(path.join(root, 'node_modules'), path.join(clone, 'node_modules'));

    // nice: this runs beside the rest of npm test (privileged files with deadlines included)
    const build = await execa('nice', ['-n', '10', 'node', 'scripts/build.mjs'], { cwd: clone, reject: false, all: true });
    expect(build.exitCode, `build in the clone failed:\n${build.all}`).toBe(0);

    // The clone's own copy of this file is left out: it would clone again.
    const run = await execa('nice', ['-n', '10', path.join(clone, 'node_modules/.bin/vitest'), 'run', '--project', 'unit', '--exclude', self], {
      cwd: clone, reject: false, all: true, env: { NO_COLOR: '1', FORCE_COLOR: '0' },
    });
    const summary = run.all.match(/Test Files\s+(.*)\n\s+Tests\s+(.*)/);
    expect(run.exitCode, `unit project in the clone failed:\n${run.all.slice(-6000)}`).toBe(0);
    // a run that found no tests would also exit 0 with --passWithNoTests; make sure it ran them
    expect(summary?.[2], run.all.slice(-2000)).toMatch(/^\d+ passed/);
    expect(Number(summary![2]!.match(/^(\d+)/)![1])).toBeGreaterThan(100);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}, 600_000);
