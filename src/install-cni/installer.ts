// install-cni's loop: put meshcap-cni into the node's CNI chain and its binary
// into the CNI bin dir(s), and keep them there. fs.watch on a directory is
// inotify on Linux: the primary CNI rewriting its conflist (write or
// temp+rename), deleting it or dropping a new file, and anyone removing
// meshcap-cni from the bin dir wake the loop at once; a slow resync (default
// 10 s) catches what a watch can miss (the directory itself replaced).
import { watch, type FSWatcher } from 'node:fs';
import path from 'node:path';
import type { Logger } from 'pino';
import { checkChain, findPrimary, insertEntry, removeEntry, type ChainCheck, type MeshcapEntry } from './config.js';
import { placeBinary, readConfDir, removeFile, sha256, writeAtomic } from './files.js';

export const BINARY_NAME = 'meshcap-cni';

export interface InstallerOptions {
  confDir: string;
  binDirs: readonly string[];
  /** A file name in confDir to use instead of libcni's first file. */
  confFile?: string;
  entry: MeshcapEntry;
  /** The meshcap-cni executable to copy. */
  source: string;
  logger: Logger;
  /** Safety-net pass period (ms). */
  resyncMs?: number;
  /** Counters (the install-cni metrics). */
  onReinsert?(reason: string): void;
  onBinaryRestore?(dir: string): void;
}

export interface SyncResult {
  chain: ChainCheck;
  /** What the pass wrote: 'inserted', 'replaced', 'converted', or nothing. */
  wrote?: string;
  binariesPlaced: string[];
}

export class CniInstaller {
  private watchers: FSWatcher[] = [];
  private timer: NodeJS.Timeout | undefined;
  private resync: NodeJS.Timeout | undefined;
  private installedOnce = false;
  private last: ChainCheck = { ok: false, file: null, detail: 'not installed yet' };
  private readonly want: string | null;
  private readonly log: Logger;
  private stopped = false;
  private running = false;
  private again = false;
  /** --conf-file; follows a .conf the installer turned into a .conflist. */
  private confFile: string | undefined;

  constructor(private readonly o: InstallerOptions) {
    this.want = sha256(o.source);
    this.confFile = o.confFile;
    this.log = o.logger.child({ component: 'install-cni' });
  }

  /** undefined when meshcap's entry is last in the config the runtime uses and every binary is in place. */
  notReady(): string | undefined {
    return this.last.ok ? undefined : this.last.detail;
  }

  /** One pass: binaries, then the config. Idempotent: a pass over a correct node writes nothing. */
  sync(): SyncResult {
    const binariesPlaced: string[] = [];
    for (const dir of this.o.binDirs) {
      const target = path.join(dir, BINARY_NAME);
      if (placeBinary(this.o.source, target, this.want)) {
        binariesPlaced.push(target);
        if (this.installedOnce) {
          this.log.warn({ target }, 'meshcap-cni was missing or different in the CNI bin dir: restored');
          this.o.onBinaryRestore?.(dir);
        } else this.log.info({ target }, 'meshcap-cni installed');
      }
    }
    const files = readConfDir(this.o.confDir);
    const primary = findPrimary(files, this.confFile);
    let wrote: string | undefined;
    if (primary) {
      for (const s of primary.skipped) this.log.warn({ file: path.join(this.o.confDir, s.name), reason: s.reason }, 'CNI config skipped (the runtime skips it too)');
      const edit = insertEntry(primary, this.o.entry);
      if (edit.action !== 'unchanged') {
        writeAtomic(path.join(this.o.confDir, edit.name), edit.text);
        if (edit.remove) removeFile(path.join(this.o.confDir, edit.remove));
        if (edit.remove && edit.remove === this.confFile) this.confFile = edit.name;
        wrote = edit.action;
        const file = path.join(this.o.confDir, edit.name);
        if (this.installedOnce) {
          this.log.warn({ file, action: edit.action }, 'the primary CNI config lost meshcap-cni (rewritten or replaced): re-inserted');
          this.o.onReinsert?.(edit.action);
        } else this.log.info({ file, action: edit.action, ...(edit.remove ? { replaces: edit.remove } : {}) }, 'meshcap-cni chained last in the CNI config');
      }
    }
    const chain = checkChain(readConfDir(this.o.confDir), this.o.entry, this.confFile);
    if (chain.ok) this.installedOnce = true;
    if (chain.ok !== this.last.ok || chain.detail !== this.last.detail) {
      if (chain.ok) this.log.info({ file: chain.file }, 'ready: meshcap-cni is last in the CNI config the runtime uses');
      else this.log.warn({ confDir: this.o.confDir, detail: chain.detail }, 'not ready');
    }
    this.last = chain;
    return { chain, ...(wrote ? { wrote } : {}), binariesPlaced };
  }

  /** Installs now, then keeps the node's config and binaries in place until stop(). */
  start(): SyncResult {
    const first = this.guarded();
    const watchDir = (dir: string, only?: string) => {
      const w = watch(dir, { persistent: true }, (_event, name) => {
        if (only && name && name !== only) return;
        this.schedule();
      });
      w.on('error', (err) => {
        this.log.error({ dir, err: err.message }, 'watch failed; relying on the periodic resync');
      });
      this.watchers.push(w);
    };
    watchDir(this.o.confDir);
    for (const d of this.o.binDirs) watchDir(d, BINARY_NAME);
    this.resync = setInterval(() => this.schedule(), this.o.resyncMs ?? 10_000);
    this.resync.unref();
    return first;
  }

  /** Coalesces a burst of events (a rewrite is several) into one pass a few ms later. */
  private schedule(): void {
    if (this.stopped || this.timer) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.guarded();
    }, 20);
  }

  private guarded(): SyncResult {
    if (this.running) {
      this.again = true;
      return { chain: this.last, binariesPlaced: [] };
    }
    this.running = true;
    try {
      return this.sync();
    } catch (err) {
      const detail = `install failed: ${(err as Error).message}`;
      this.log.error({ confDir: this.o.confDir, binDirs: this.o.binDirs, err: (err as Error).message }, 'install-cni pass failed; retrying on the next change or resync');
      this.last = { ok: false, file: null, detail };
      return { chain: this.last, binariesPlaced: [] };
    } finally {
      this.running = false;
      if (this.again) {
        this.again = false;
        this.schedule();
      }
    }
  }

  stop(): void {
    this.stopped = true;
    for (const w of this.watchers) w.close();
    this.watchers = [];
    if (this.timer) clearTimeout(this.timer);
    if (this.resync) clearInterval(this.resync);
  }
}

/** Removes meshcap-cni from every config file in the dir and its binary from every bin dir. */
export function uninstallCni(o: { confDir: string; binDirs: readonly string[]; logger: Logger }): { files: string[]; binaries: string[] } {
  const log = o.logger.child({ component: 'install-cni' });
  const files: string[] = [];
  for (const f of readConfDir(o.confDir)) {
    const text = removeEntry(f);
    if (text === null) continue;
    const file = path.join(o.confDir, f.name);
    writeAtomic(file, text);
    files.push(file);
    log.info({ file }, 'meshcap-cni removed from the CNI config');
  }
  const binaries: string[] = [];
  for (const dir of o.binDirs) {
    const target = path.join(dir, BINARY_NAME);
    if (removeFile(target)) {
      binaries.push(target);
      log.info({ target }, 'meshcap-cni binary removed');
    }
  }
  return { files, binaries };
}
