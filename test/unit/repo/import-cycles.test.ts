// src/ has no import cycles, type-only imports included. A cycle means two
// modules are one module in two files: neither can be read or tested without
// the other (src/cni/spec.ts <-> types.ts was one).
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const src = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'src');

/** Relative imports and re-exports of each .ts file, as absolute .ts paths. */
export function importGraph(files: Map<string, string>): Map<string, string[]> {
  const g = new Map<string, string[]>();
  for (const [file, text] of files) {
    const deps = [...text.matchAll(/^\s*(?:import|export)\s[^'";]*?from\s+['"](\.{1,2}\/[^'"]+)['"]/gm)]
      .map((m) => path.resolve(path.dirname(file), m[1]!.replace(/\.js$/, '.ts')));
    g.set(file, deps.filter((d) => files.has(d)));
  }
  return g;
}

/** Every cycle found by a depth-first walk, each as a list of files. */
export function cycles(g: Map<string, string[]>): string[][] {
  const found: string[][] = [];
  const done = new Set<string>();
  const stack: string[] = [];
  const visit = (n: string) => {
    stack.push(n);
    for (const d of g.get(n) ?? []) {
      const at = stack.indexOf(d);
      if (at >= 0) found.push([...stack.slice(at), d]);
      else if (!done.has(d)) visit(d);
    }
    stack.pop();
    done.add(n);
  };
  for (const n of g.keys()) if (!done.has(n)) visit(n);
  return found;
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sourceFiles(path.join(dir, e.name)) : e.name.endsWith('.ts') ? [path.join(dir, e.name)] : []);
}

describe('import graph of src/', () => {
  it('has no cycles', () => {
    const files = new Map(sourceFiles(src).map((f) => [f, readFileSync(f, 'utf8')]));
    expect(files.size).toBeGreaterThan(50);
    const found = cycles(importGraph(files)).map((c) => c.map((f) => path.relative(src, f)).join(' -> '));
    expect(found).toEqual([]);
  });

  it('sees a cycle through type-only and multi-line imports', () => {
    const a = path.join(src, 'x', 'a.ts');
    const b = path.join(src, 'x', 'b.ts');
    const c = path.join(src, 'y', 'c.ts');
    const files = new Map([
      [a, "import type { B } from './b.js';\n"],
      [b, "import {\n  C,\n  type D,\n} from '../y/c.js';\nexport type B = C;\n"],
      [c, "export type { A } from '../x/a.js';\n"],
    ]);
    expect(cycles(importGraph(files)).map((cy) => cy.map((f) => path.basename(f)))).toEqual([['a.ts', 'b.ts', 'c.ts', 'a.ts']]);
    files.set(c, 'export const C = 1;\n');
    expect(cycles(importGraph(files))).toEqual([]);
  });
});
