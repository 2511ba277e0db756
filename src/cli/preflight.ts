// Checks a command makes before it touches the kernel or the agent's files,
// so that the operator reads what is wrong instead of a raw EACCES/ENOTDIR.
import { statSync } from 'node:fs';
import { CliFailure, UsageError } from './exit.js';

/** Root is needed: BPF syscalls, bpffs pins, netns/cgroup creation, the agent's records. */
export function requireRoot(command: string, why: string, euid: number | undefined = process.geteuid?.()): void {
  if (euid === undefined || euid === 0) return;
  throw new CliFailure(`${command} needs root (it ${why}); you are uid ${euid}: run it as root, e.g. sudo meshcap ${command}`);
}

/** A directory option that names something else (a file) is a usage error; a missing one is left to the command. */
export function checkDirOption(flag: string, dir: string): void {
  let st;
  try {
    st = statSync(dir);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return;
    if (code === 'ENOTDIR') throw new UsageError(`${flag} ${dir}: a part of this path is a file, not a directory`);
    if (code === 'EACCES') throw new CliFailure(`${flag} ${dir}: permission denied (run as root)`);
    throw e;
  }
  if (!st.isDirectory()) throw new UsageError(`${flag} ${dir} is not a directory (it is a file): pass the directory that holds the agent's records`);
}
