// The benches' small C tools, compiled with the machine's cc into build/
// when missing or older than their source (no build step of their own).
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import path from 'node:path';

/** Compiles src to out unless out is newer; true when it compiled. */
export function compileIfStale(src: string, out: string, flags: readonly string[] = ['-O2', '-Wall', '-Wextra', '-Werror']): boolean {
  if (existsSync(out) && statSync(out).mtimeMs >= statSync(src).mtimeMs) return false;
  mkdirSync(path.dirname(out), { recursive: true });
  execFileSync('cc', [...flags, '-o', out, src], { stdio: 'inherit' });
  return true;
}
