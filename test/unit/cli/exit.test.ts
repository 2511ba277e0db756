// One exit-code convention for every command (src/cli/exit.ts): 0 ok, 1 the
// command failed (message only), 2 the command line is wrong (message and a
// pointer to --help); write errors on stdout end the process without a stack.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { CliFailure, configureExits, runCli, stdoutErrorExit, UsageError } from '../../../src/cli/exit.js';
import { checkDirOption, requireRoot } from '../../../src/cli/preflight.js';

async function run(argv: string[], action: () => void | Promise<void> = () => {}) {
  let out = '';
  let err = '';
  const program = configureExits(new Command('meshcap')).configureOutput({ writeErr: (s) => (err += s), writeOut: (s) => (out += s) });
  program.command('thing').description('does a thing').option('--n <n>', 'a number').action(action);
  const code = await runCli(program, ['node', 'meshcap', ...argv], { err: (s) => (err += s) });
  return { out, err, code };
}

describe('exit codes and usage', () => {
  it('0 for success and for --help (help on stdout, nothing on stderr)', async () => {
    expect((await run(['thing'])).code).toBe(0);
    const h = await run(['thing', '--help']);
    expect(h.code).toBe(0);
    expect(h.out).toMatch(/Usage: meshcap thing/);
    expect(h.err).toBe('');
    expect((await run(['--help'])).code).toBe(0);
  });

  it('2 for commander\'s own errors, with a pointer to the command\'s --help and not the whole usage', async () => {
    const r = await run(['thing', '--bogus']);
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/unknown option '--bogus'/);
    expect(r.err).toMatch(/Run 'meshcap thing --help' for usage\./);
    expect(r.err).not.toMatch(/Options:/);
    expect((await run(['nope'])).code).toBe(2);
    expect((await run(['thing', '--n'])).code).toBe(2);
  });

  it('2 for a UsageError from an action, with the hint', async () => {
    const r = await run(['thing'], () => { throw new UsageError('--n must be a number'); });
    expect(r).toMatchObject({ code: 2 });
    expect(r.err).toBe("meshcap: --n must be a number\nRun 'meshcap thing --help' for usage.\n");
  });

  it('1 for a failure, with the message only: no usage, no stack', async () => {
    for (const e of [new CliFailure('the kernel said no'), new Error('the kernel said no')]) {
      const r = await run(['thing'], async () => { throw e; });
      expect(r.code).toBe(1);
      expect(r.err).toBe('meshcap: the kernel said no\n');
    }
  });

  it('EPIPE on stdout is a quiet exit 0; ENOSPC and others say what failed, exit 1', () => {
    let err = '';
    const io = { err: (s: string) => (err += s) };
    expect(stdoutErrorExit(Object.assign(new Error('write EPIPE'), { code: 'EPIPE' }), io)).toBe(0);
    expect(err).toBe('');
    expect(stdoutErrorExit(Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' }), io)).toBe(1);
    expect(err).toBe('meshcap: cannot write the output to stdout: no space left on device (ENOSPC)\n');
  });
});

describe('preflight', () => {
  it('names root as what is missing, for a non-root uid only', () => {
    expect(() => requireRoot('status', 'reads the records', 0)).not.toThrow();
    expect(() => requireRoot('status', 'reads the records', 1000)).toThrow(CliFailure);
    expect(() => requireRoot('status', 'reads the records', 1000)).toThrow(/^status needs root \(it reads the records\); you are uid 1000: run it as root/);
  });

  it('a file given as a directory option is a usage error that says so; a missing directory is left to the command', () => {
    const dir = mkdtempSync(join(tmpdir(), 'meshcap-pre-'));
    try {
      writeFileSync(join(dir, 'f'), '');
      expect(() => checkDirOption('--state-dir', join(dir, 'f'))).toThrow(UsageError);
      expect(() => checkDirOption('--state-dir', join(dir, 'f'))).toThrow(/--state-dir .*\/f is not a directory \(it is a file\)/);
      expect(() => checkDirOption('--state-dir', join(dir, 'f', 'x'))).toThrow(/a part of this path is a file/);
      expect(() => checkDirOption('--state-dir', join(dir, 'missing'))).not.toThrow();
      expect(() => checkDirOption('--state-dir', dir)).not.toThrow();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

