// How every meshcap command ends. One convention:
//   0  done (also --help, and a reader that closed our stdout early: `| head`)
//   1  the command ran and failed (a kernel refusal, a pod that cannot be
//      rendered, no space left to write the output, ...): the reason, no usage
//   2  the command line is wrong (unknown option, bad value, stray word): the
//      reason and a pointer to `--help`; commander's own errors land here too
// Usage text is printed for exit 2 only, never after a runtime failure.
import { CommanderError, type Command } from 'commander';

export const EXIT_OK = 0;
export const EXIT_FAILURE = 1;
export const EXIT_USAGE = 2;

/** A command line that cannot be right; exit 2, with a pointer to --help. */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

/** A failure whose message says everything (no "meshcap:" stack or code suffix needed). */
export class CliFailure extends Error {
  override readonly name = 'CliFailure';
}

export interface CliIo {
  err: (s: string) => void;
  debug?: boolean;
}

/** The commander path of the subcommand argv names (`meshcap iptables render`), for the help hint. */
export function commandPath(program: Command, argv: readonly string[]): string {
  const names = [program.name()];
  let cmd = program;
  for (const a of argv) {
    if (a.startsWith('-')) break;
    const sub = cmd.commands.find((c) => c.name() === a || c.aliases().includes(a));
    if (!sub) break;
    names.push(sub.name());
    cmd = sub;
  }
  return names.join(' ');
}

/** Sets the convention up on a program before its subcommands are added (they inherit it). */
export function configureExits(program: Command): Command {
  return program.exitOverride().showHelpAfterError(false);
}

/**
 * Runs the program and returns the exit code. Errors commander prints itself
 * (unknown option, missing argument, invalid choice) are already on stderr.
 */
export async function runCli(program: Command, argv: readonly string[], io: CliIo): Promise<number> {
  const args = argv.slice(2);
  try {
    await program.parseAsync([...argv]);
    return typeof process.exitCode === 'number' ? process.exitCode : EXIT_OK;
  } catch (e) {
    return exitCodeFor(e, program, args, io);
  }
}

export function exitCodeFor(e: unknown, program: Command, args: readonly string[], io: CliIo): number {
  const hint = () => io.err(`Run '${commandPath(program, args)} --help' for usage.\n`);
  if (e instanceof CommanderError) {
    // --help, --version, and a bare `meshcap` (help shown, exit 1 by commander): help is not an error.
    if (e.code === 'commander.helpDisplayed' || e.code === 'commander.version') return EXIT_OK;
    if (e.code === 'commander.help') return args.length === 0 ? EXIT_USAGE : EXIT_OK;
    if (e.code === 'commander.executeSubCommandAsync') return e.exitCode;
    // commander printed "error: ..." already.
    hint();
    return e.exitCode === 0 ? EXIT_OK : EXIT_USAGE;
  }
  if (e instanceof UsageError) {
    io.err(`meshcap: ${e.message}\n`);
    hint();
    return EXIT_USAGE;
  }
  const err = e as Error & { code?: string; log?: string };
  io.err(`meshcap: ${err?.message ?? String(e)}\n`);
  if (io.debug && err?.stack) io.err(`${err.stack}\n`);
  if (io.debug && err?.log) io.err(`${err.log}\n`);
  return EXIT_FAILURE;
}

/**
 * What a failed write to stdout means for the process: EPIPE is a reader that
 * has what it wanted (`meshcap ... | head -1`): leave quietly, exit 0, as a
 * filter killed by SIGPIPE would have printed nothing either (0 rather than
 * 141 so `set -o pipefail` scripts that cut the output short keep working).
 * Anything else (ENOSPC on /dev/full, EIO) is a failure: one line, exit 1.
 */
export function stdoutErrorExit(err: NodeJS.ErrnoException, io: Pick<CliIo, 'err'>): number {
  if (err.code === 'EPIPE') return EXIT_OK;
  const what = err.code === 'ENOSPC' ? 'no space left on device' : err.message;
  io.err(`meshcap: cannot write the output to stdout: ${what}${err.code ? ` (${err.code})` : ''}\n`);
  return EXIT_FAILURE;
}

/**
 * Routes stdout/stderr write errors (which Node raises as unhandled 'error'
 * events, with a stack trace) through stdoutErrorExit, and exits at once:
 * nothing more can be written.
 */
export function guardStdio(exit: (code: number) => never = (c) => process.exit(c)): void {
  process.stdout.on('error', (err: NodeJS.ErrnoException) => {
    exit(stdoutErrorExit(err, { err: (s) => { try { process.stderr.write(s); } catch { /* stderr is gone too */ } } }));
  });
  process.stderr.on('error', () => exit(EXIT_FAILURE));
}
