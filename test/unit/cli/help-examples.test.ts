// Every command's --help ends with examples (issue 18 part 4): each command
// file has one examples(...) per action it registers.
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { examples } from '../../../src/cli/help.js';

const cli = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'src', 'cli');

describe('examples in every command\'s help', () => {
  it('one examples(...) per registered action', () => {
    const files = readdirSync(cli).filter((f) => f.endsWith('.ts') && f !== 'help.ts');
    let actions = 0;
    for (const f of files) {
      const text = readFileSync(path.join(cli, f), 'utf8');
      const a = (text.match(/\.action\(/g) ?? []).length;
      const e = (text.match(/\bexamples\(/g) ?? []).length;
      actions += a;
      expect(e, `${f}: ${a} command(s), ${e} examples block(s)`).toBeGreaterThanOrEqual(a);
    }
    expect(actions).toBeGreaterThanOrEqual(10);
  });

  it('formats the block commander appends after the options', () => {
    expect(examples('meshcap a', 'meshcap b')).toBe('\nExamples:\n  meshcap a\n  meshcap b');
  });
});
