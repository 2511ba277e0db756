// `meshcap --help` and the light commands must start fast (issue 18: every
// command took ~0.7 s, even --help): the heavy modules (the native addon,
// @kubernetes/client-node, pino, the sandbox, the agent, the loader) are
// imported inside the command actions with import(), never at start-up.
// Deterministic, not a timing test: every file is compiled the way tsc emits
// it (so imports used only as types are gone, as they are in dist/), and the
// static imports are followed from src/cli/main.ts; `import()` is not followed.
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const src = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'src');

/** The modules `node dist/<entry>.js` loads before running any action: relative files and packages. */
export function startupModules(
  entry: string,
  read: (file: string) => string = (f) => readFileSync(f, 'utf8'),
  exists: (file: string) => boolean = existsSync,
): { files: string[]; packages: string[] } {
  const files = new Set<string>();
  const packages = new Set<string>();
  const visit = (file: string) => {
    if (files.has(file)) return;
    files.add(file);
    const js = ts.transpileModule(read(file), {
      compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
      fileName: file,
    }).outputText;
    const specs = [
      ...js.matchAll(/^\s*(?:import|export)\s[^'";]*?\sfrom\s+['"]([^'"]+)['"]/gm),
      ...js.matchAll(/^\s*import\s+['"]([^'"]+)['"]/gm),
    ].map((m) => m[1]!);
    for (const s of specs) {
      if (s.startsWith('.')) {
        const target = path.resolve(path.dirname(file), s.replace(/\.js$/, '.ts'));
        if (exists(target)) visit(target);
      } else if (!s.startsWith('node:')) {
        packages.add(s.startsWith('@') ? s.split('/').slice(0, 2).join('/') : s.split('/')[0]!);
      }
    }
  };
  visit(entry);
  return { files: [...files].map((f) => path.relative(src, f)).sort(), packages: [...packages].sort() };
}

const HEAVY_PACKAGES = ['@kubernetes/client-node', 'pino', 'prom-client', 'execa', 'ajv'];
const HEAVY_FILES = /^(native\/|sandbox\/|agent\/agent\.ts|loader\/(datapath|probe)\.ts|kube\/(api-source|client-node|rest)\.ts|proxy\/)/;

describe('meshcap start-up imports', () => {
  // main.ts imports the invoked command's module (all of them for help): each
  // command module and what it imports statically load before any action.
  const main = path.join(src, 'cli', 'main.ts');
  const commandModules = [...readFileSync(main, 'utf8').matchAll(/import\('(\.\/[^']+)'\)/g)].map((m) => path.join(src, 'cli', m[1]!.replace(/\.js$/, '.ts')));
  const walks = [main, ...commandModules].map((f) => startupModules(f));
  const files = [...new Set(walks.flatMap((w) => w.files))].sort();
  const packages = [...new Set(walks.flatMap((w) => w.packages))].sort();

  it('reaches every command file (the walk works)', () => {
    expect(commandModules.length).toBeGreaterThanOrEqual(11);
    expect(files).toContain('cli/main.ts');
    expect(files).toContain('cli/status-command.ts');
    expect(files).toContain('cli/agent-command.ts');
    expect(packages).toContain('commander');
  });

  it('loads no heavy package before an action runs', () => {
    expect(packages.filter((p) => HEAVY_PACKAGES.includes(p))).toEqual([]);
  });

  it('loads neither the native addon nor the agent, loader, sandbox or proxy before an action runs', () => {
    expect(files.filter((f) => HEAVY_FILES.test(f))).toEqual([]);
  });

  it('the walk sees a heavy import through a chain, and skips type-only and dynamic ones', () => {
    const fake = new Map([
      [path.join(src, 'x', 'a.ts'), "import { b } from './b.js';\nimport type { Logger } from 'pino';\nexport const a = () => import('../native/addon.js');\nb();"],
      [path.join(src, 'x', 'b.ts'), "import { KubeConfig } from '@kubernetes/client-node';\nexport const b = () => new KubeConfig();"],
    ]);
    const r = startupModules(path.join(src, 'x', 'a.ts'), (f) => fake.get(f) ?? '', (f) => fake.has(f));
    expect(r.packages).toEqual(['@kubernetes/client-node']);
    expect(r.files).toEqual(['x/a.ts', 'x/b.ts']);
  });
});
