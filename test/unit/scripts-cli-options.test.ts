import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { afterAll, describe, expect, it } from 'vitest';
import { headerOf } from '../../scripts/lib/cli-options.mjs';
import { projectRoot } from '../../src/paths.js';

describe('scripts/lib/cli-options', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'meshcap-cli-options-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const script = path.join(dir, 'tool.mjs');
  writeFileSync(script, [
    '#!/usr/bin/env node',
    '// @ts-check',
    '// npm run tool — what the tool does.',
    '//',
    '//   node tool.mjs [--count N] [--fast]',
    `import { parseOptions } from ${JSON.stringify(path.join(projectRoot, 'scripts/lib/cli-options.mjs'))};`,
    "const opt = parseOptions(import.meta.url, 'tool', { count: { type: 'string', default: '3' }, fast: { type: 'boolean', default: false } });",
    'console.log(JSON.stringify(opt));',
    '',
  ].join('\n'));
  const run = (...args: string[]) => execa(process.execPath, [script, ...args], { reject: false });

  it('headerOf gives the leading comment block without markers, shebang or @ts-check', () => {
    expect(headerOf('#!/usr/bin/env node\n// @ts-check\n// one\n//\n//   two\nimport x;\n// not this')).toBe('one\n\n  two');
    expect(headerOf('import x;\n// late')).toBe('');
  });

  it('parses the options with their defaults', async () => {
    const r = await run('--count', '7');
    expect(r.exitCode).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual({ count: '7', fast: false });
  });

  it('--help and -h print the header and exit 0', async () => {
    for (const flag of ['--help', '-h']) {
      const r = await run(flag);
      expect(r.exitCode).toBe(0);
      expect(r.stdout).toBe('npm run tool — what the tool does.\n\n  node tool.mjs [--count N] [--fast]');
    }
  });

  it('an unknown option, a missing value or a positional is one line on stderr and exit 2, no stack trace', async () => {
    for (const [args, why] of [[['--bogus'], /Unknown option '--bogus'/], [['--count'], /--count <value>' argument missing/], [['extra'], /positional argument/]] as const) {
      const r = await run(...args);
      expect(r.exitCode, args.join(' ')).toBe(2);
      expect(r.stdout).toBe('');
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toMatch(why);
      expect(r.stderr).toMatch(/^tool: .*\(--help lists the options\)$/);
    }
  });
});
