// Commands are registered in src/cli/ only: one place lists what `meshcap`
// can do, and the modules behind each command (fallback-iptables, proxy,
// agent, loader, ...) hold logic, not command-line wiring. Every register*
// function that src/cli/ exports is also called by main.ts.
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const src = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'src');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sourceFiles(path.join(dir, e.name)) : e.name.endsWith('.ts') ? [path.join(dir, e.name)] : []);
}

/** Files that import commander. */
export function commanderUsers(files: Map<string, string>): string[] {
  return [...files].filter(([, text]) => /from\s+['"]commander['"]/.test(text)).map(([f]) => f);
}

describe('command registration', () => {
  const files = new Map(sourceFiles(src).map((f) => [path.relative(src, f), readFileSync(f, 'utf8')]));

  it('only src/cli/ imports commander', () => {
    const users = commanderUsers(files);
    expect(users).toContain('cli/main.ts');
    expect(users.filter((f) => !f.startsWith('cli/'))).toEqual([]);
  });

  it('main.ts calls every register function src/cli/ exports', () => {
    const exported = [...files].filter(([f]) => f.startsWith('cli/'))
      .flatMap(([, text]) => [...text.matchAll(/export function (register\w+)\(/g)].map((m) => m[1]!));
    expect(exported.length).toBeGreaterThanOrEqual(7);
    const main = files.get('cli/main.ts')!;
    // main.ts registers each command module's function (loaded by import(): see startup-imports.test.ts)
    for (const fn of exported) expect(main, fn).toMatch(new RegExp(`\\)\\)\\.${fn}\\]`));
  });

  it('the check sees commander outside src/cli/', () => {
    const bad = new Map([['proxy/main.ts', "import { Command } from 'commander';"], ['cli/x.ts', "import type { Command } from 'commander';"]]);
    expect(commanderUsers(bad)).toEqual(['proxy/main.ts', 'cli/x.ts']);
  });
});
