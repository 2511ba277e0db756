// The repository must stand on its own: no tracked file may read or link a
// path outside it (a fresh clone has no sibling directories and no workspace
// around it).
// Reads the tracked files (git ls-files) and checks three things: the
// workspace's sibling directories are never named, no absolute path into the
// machine that made the repository appears, and every relative reference
// (markdown link, '../' string, #include, CMake/shell path) stays inside the
// repository, and for markdown links, names a tracked file.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

interface Leak { file: string; line: number; ref: string; why: string }

/** Relative references and the prefixes that anchor them at the file's own directory. */
const RELATIVE_REF = /(?:^|[^\w./$}-])((?:\$\{CMAKE_CURRENT_SOURCE_DIR\}\/|\$\(dirname "\$0"\)\/)?(?:\.\.\/)+[^\s'"`)\]},;:>]*)/g;
const MARKDOWN_LINK = /\]\(([^)\s]+)\)/g;
/** The workspace this repository was made in sits at /work; its siblings (shared/, …) are not ours. */
const WORKSPACE_PATH = /(?:^|[^\w./-])(\/work\/[\w.-]*)/g;
const SIBLING_DIR = /(?:^|[^\w-])((?:\.\.\/)+shared\b|shared\/(?:compat|DESIGN\.md|hooks)\b)/g;

/** Every tracked text file as [path, content]; binary files (a NUL byte) are skipped. */
export function trackedTextFiles(dir: string): [string, string][] {
  const files = execFileSync('git', ['ls-files', '-z'], { cwd: dir, encoding: 'utf8' }).split('\0').filter(Boolean);
  const out: [string, string][] = [];
  for (const f of files) {
    let text: string;
    try { text = readFileSync(path.join(dir, f), 'utf8'); } catch { continue; } // deleted in the work tree
    if (!text.includes('\0')) out.push([f, text]);
  }
  return out;
}

/** The references in one file that leave the repository rooted at dir. */
export function leaks(dir: string, file: string, text: string, tracked: Set<string>): Leak[] {
  const found: Leak[] = [];
  const fileDir = path.dirname(path.join(dir, file));
  const inside = (abs: string) => abs === dir || abs.startsWith(dir + path.sep);
  const parent = path.dirname(dir);
  const lines = text.split('\n');
  lines.forEach((line, i) => {
    const at = (ref: string, why: string) => found.push({ file, line: i + 1, ref, why });
    for (const m of line.matchAll(SIBLING_DIR)) at(m[1]!, 'names a directory beside the repository');
    for (const m of line.matchAll(WORKSPACE_PATH)) at(m[1]!, 'absolute path into the workspace');
    // this very checkout's location, wherever it is (the parent only where it says something)
    if (line.includes(dir + '/')) at(dir, "absolute path of this checkout");
    else if (parent !== '/' && parent.split('/').length > 2 && line.includes(parent + '/')) at(parent, 'absolute path beside this checkout');
    for (const m of line.matchAll(RELATIVE_REF)) {
      const ref = m[1]!.replace(/^\$\{CMAKE_CURRENT_SOURCE_DIR\}\/|^\$\(dirname "\$0"\)\//, '');
      if (!inside(path.resolve(fileDir, ref))) at(m[1]!, 'relative path resolves outside the repository');
    }
    if (file.endsWith('.md')) {
      for (const m of line.matchAll(MARKDOWN_LINK)) {
        const target = m[1]!.split('#')[0]!;
        if (!target || /^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // anchor only, or a URL
        const abs = path.resolve(fileDir, target);
        if (!inside(abs)) at(m[1]!, 'markdown link leaves the repository');
        else {
          const rel = path.relative(dir, abs);
          if (!tracked.has(rel) && ![...tracked].some((t) => t.startsWith(rel + '/'))) at(m[1]!, 'markdown link to a file that is not tracked');
        }
      }
    }
  });
  return found;
}

describe('the repository is self-contained', () => {
  const files = trackedTextFiles(root);
  const tracked = new Set(execFileSync('git', ['ls-files', '-z'], { cwd: root, encoding: 'utf8' }).split('\0').filter(Boolean));

  it('reads the tracked files', () => {
    expect(files.map(([f]) => f)).toEqual(expect.arrayContaining(['README.md', 'package.json', 'src/cli/main.ts', 'test/fixtures/istio/istio-iptables-vectors.json']));
  });

  it('no tracked file reads or links anything outside the repository', () => {
    const all = files.flatMap(([f, text]) => leaks(root, f, text, tracked));
    expect(all.map((l) => `${l.file}:${l.line}: ${l.ref} (${l.why})`)).toEqual([]);
  });

  // The checker itself must see each kind of leak, or the test above proves
  // nothing. The names are assembled so that this file does not flag itself.
  const SHARED = 'shared';
  const WORK = '/' + 'work';
  it.each([
    ['README.md', `see [the design](../${SHARED}/DESIGN.md)`],
    ['test/x.test.ts', `readFileSync(new URL('../../../${SHARED}/compat/v.json', import.meta.url))`],
    ['docs/x.md', `vectors live in \`${WORK}/${SHARED}/compat/\``],
    ['scripts/x.sh', 'cd "$(dirname "$0")/../../elsewhere"'],
    ['native/x/CMakeLists.txt', 'set(D "${CMAKE_CURRENT_SOURCE_DIR}/../../../outside")'],
    ['bpf/x.bpf.c', '#include "../../vendor/x.h"'],
    ['docs/x.md', 'see [x](missing-file.md)'],
    ['docs/x.md', `at ${root}/src/cli/main.ts`],
  ])('catches %s: %s', (file, line) => {
    expect(leaks(root, file, line, tracked)).not.toEqual([]);
  });

  it.each([
    ['test/unit/x/y.test.ts', "import { a } from '../../helpers/pods.js';"],
    ['docs/x.md', 'see [cni](cni.md#wire) and [src](../src/cli/main.ts) and [w](https://example.com/../x)'],
    ['native/cni/CMakeLists.txt', 'set(D "${CMAKE_CURRENT_SOURCE_DIR}/../../build/bin")'],
    ['bpf/x.md', 'the shared map and scripts/setup.sh, /scratch/work/x'],
  ])('leaves alone %s: %s', (file, line) => {
    expect(leaks(root, file, line, tracked)).toEqual([]);
  });
});
