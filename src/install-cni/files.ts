// install-cni's file system side: read the conf dir, write a file atomically,
// place the meshcap-cni binary atomically.
//
// Atomic = a temp file in the same directory, then rename(2) over the target:
// a runtime reading the config sees the old file or the new one, never half of
// either; a runtime exec'ing meshcap-cni keeps the old inode (writing into a
// running executable would fail with ETXTBSY, and truncating it would crash the
// exec), the next exec gets the new one.
import { createHash } from 'node:crypto';
import { chmodSync, closeSync, copyFileSync, fsyncSync, openSync, readdirSync, readFileSync, renameSync, rmSync, statSync, unlinkSync, writeSync } from 'node:fs';
import path from 'node:path';
import { isConfName, type ConfFile } from './config.js';

/** Every CNI config file in the directory (by name), with its text; unreadable ones are left out. */
export function readConfDir(dir: string): ConfFile[] {
  const out: ConfFile[] = [];
  for (const name of readdirSync(dir)) {
    if (!isConfName(name)) continue;
    try {
      const full = path.join(dir, name);
      if (!statSync(full).isFile()) continue;
      out.push({ name, text: readFileSync(full, 'utf8') });
    } catch {
      // removed between readdir and read: the watch will tell us again
    }
  }
  return out;
}

function tempName(target: string): string {
  // a dot name with no CNI extension: never mistaken for a config by the runtime
  return path.join(path.dirname(target), `.${path.basename(target)}.meshcap-${process.pid}.tmp`);
}

/** Writes `text` to `file` via a temp file in the same directory + fsync + rename. */
export function writeAtomic(file: string, text: string, mode = 0o644): void {
  const tmp = tempName(file);
  try {
    const fd = openSync(tmp, 'w', mode);
    try {
      writeSync(fd, text);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    chmodSync(tmp, mode);
    renameSync(tmp, file);
  } catch (err) {
    rmSync(tmp, { force: true });
    throw err;
  }
}

export function sha256(file: string): string | null {
  try {
    return createHash('sha256').update(readFileSync(file)).digest('hex');
  } catch {
    return null;
  }
}

/** Copies `source` to `target` (0755) unless it already has the same bytes; true when it copied. */
export function placeBinary(source: string, target: string, want = sha256(source)): boolean {
  if (want === null) throw new Error(`${source} cannot be read: the image has no meshcap-cni to install`);
  if (sha256(target) === want) return false;
  const tmp = tempName(target);
  try {
    copyFileSync(source, tmp);
    chmodSync(tmp, 0o755);
    const fd = openSync(tmp, 'r');
    try {
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, target);
  } catch (err) {
    rmSync(tmp, { force: true });
    throw err;
  }
  return true;
}

/** unlink, ignoring a file that is already gone. */
export function removeFile(file: string): boolean {
  try {
    unlinkSync(file);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw err;
  }
}
