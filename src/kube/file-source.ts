// `--pods FILE`: pods from a manifest file that an operator (or a demo) edits.
// Follows the file through in-place writes and editors' rename-replace (watch
// on the directory), with an mtime poll as a fallback for filesystems where
// inotify says nothing (NFS, some container mounts).
import { createHash } from 'node:crypto';
import { watch, type FSWatcher } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import { basename, dirname, resolve } from 'node:path';
import type { V1Pod } from '@kubernetes/client-node';
import { pino, type Logger } from 'pino';
import { CachedPodSource } from './pod-cache.js';
import { ManifestError, parsePodManifests } from './pod-manifests.js';
import type { PodChangeListener, PodSource } from './pod-source.js';

export interface FileSourceOptions {
  path: string;
  logger?: Logger;
  /** Quiet time after the last change event before re-reading (editors write in bursts). */
  debounceMs?: number;
  /** mtime/size/inode poll interval, the fallback when no watch event arrives. */
  pollIntervalMs?: number;
  /** Set false where inotify never fires (some network filesystems): poll only. */
  watch?: boolean;
}

export interface FileSourceError {
  message: string;
  line?: number;
  column?: number;
}

export class FileSource extends CachedPodSource implements PodSource {
  readonly path: string;
  private readonly log: Logger;
  private readonly debounceMs: number;
  private readonly pollIntervalMs: number;
  private readonly useWatch: boolean;
  private watcher: FSWatcher | undefined;
  private debounceTimer: NodeJS.Timeout | undefined;
  private pollTimer: NodeJS.Timeout | undefined;
  private isSynced = false;
  /** The last good text's digest (the text itself would be kept for as long as the file is unchanged). */
  private lastDigest: string | undefined;
  private lastFingerprint = '';
  private error: FileSourceError | undefined;
  private reloading: Promise<void> | undefined;
  private reloadAgain = false;

  constructor(opts: FileSourceOptions) {
    super();
    this.path = resolve(opts.path);
    this.log = (opts.logger ?? pino({ name: 'meshcap' })).child({ component: 'pod-file', file: this.path });
    this.debounceMs = opts.debounceMs ?? 100;
    this.pollIntervalMs = opts.pollIntervalMs ?? 2000;
    this.useWatch = opts.watch ?? true;
  }

  /** Reads the file; rejects (naming file and line) if it is missing or invalid. */
  async start(): Promise<void> {
    if (this.stopped) throw new Error(`pod source for ${this.path} was stopped`);
    if (this.isSynced) return;
    let text: string;
    try {
      this.lastFingerprint = await this.fingerprint();
      text = await readFile(this.path, 'utf8');
    } catch (err) {
      throw new Error(`cannot read pods file ${this.path}: ${(err as Error).message}`, { cause: err });
    }
    this.apply(text, true);
    this.isSynced = true;
    this.follow();
  }

  synced(): boolean {
    return this.isSynced;
  }

  /** The current problem with the file (the last good state is still served), if any. */
  lastError(): FileSourceError | undefined {
    return this.error;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.watcher?.close();
    this.watcher = undefined;
    clearTimeout(this.debounceTimer);
    clearInterval(this.pollTimer);
    this.cache.cancelWaiters();
    await this.reloading;
  }

  private follow(): void {
    if (this.useWatch) this.watchDirectory();
    this.pollTimer = setInterval(() => void this.poll(), this.pollIntervalMs);
    this.pollTimer.unref();
  }

  private watchDirectory(): void {
    const base = basename(this.path);
    try {
      // The directory, not the file: a rename-replace gives the file a new
      // inode, and a watch on the old inode would go silent.
      this.watcher = watch(dirname(this.path), { persistent: false }, (_event, filename) => {
        if (filename === null || filename.toString() === base) this.schedule();
      });
      this.watcher.on('error', (err) => {
        this.log.warn({ err }, 'watching the pods file directory failed; relying on polling');
        this.watcher?.close();
        this.watcher = undefined;
      });
    } catch (err) {
      this.log.warn({ err }, 'cannot watch the pods file directory; relying on polling');
    }
  }

  private async poll(): Promise<void> {
    const fp = await this.fingerprint().catch(() => 'missing');
    if (fp !== this.lastFingerprint) this.schedule();
  }

  private schedule(): void {
    if (this.stopped) return;
    clearTimeout(this.debounceTimer);
    this.debounceTimer = setTimeout(() => void this.reload(), this.debounceMs);
    this.debounceTimer.unref();
  }

  // One reload at a time; a change during a reload triggers one more.
  private async reload(): Promise<void> {
    if (this.reloading) {
      this.reloadAgain = true;
      return this.reloading;
    }
    this.reloading = (async () => {
      do {
        this.reloadAgain = false;
        await this.reloadOnce();
      } while (this.reloadAgain && !this.stopped);
    })();
    try {
      await this.reloading;
    } finally {
      this.reloading = undefined;
    }
  }

  private async reloadOnce(): Promise<void> {
    let text: string;
    try {
      this.lastFingerprint = await this.fingerprint();
      text = await readFile(this.path, 'utf8');
    } catch (err) {
      this.lastFingerprint = 'missing';
      const code = (err as NodeJS.ErrnoException).code;
      // Mid rename-replace the file is briefly absent; the next event reloads.
      this.fail({ message: code === 'ENOENT' ? 'pods file is missing' : `cannot read pods file: ${(err as Error).message}` });
      return;
    }
    if (this.stopped) return;
    this.apply(text, false);
  }

  private apply(text: string, strict: boolean): void {
    const digest = createHash('sha256').update(text).digest('base64');
    if (digest === this.lastDigest) return;
    let pods: V1Pod[];
    try {
      const parsed = parsePodManifests(text, this.path, (pod) => this.cache.view(pod));
      pods = parsed.pods;
      for (const s of parsed.skipped) this.log.debug({ kind: s.kind, line: s.line }, 'ignoring a non-Pod object in the pods file');
    } catch (err) {
      if (strict) throw err;
      if (err instanceof ManifestError) {
        this.fail({ message: err.detail, line: err.line, column: err.column });
      } else {
        this.fail({ message: (err as Error).message });
      }
      return;
    }
    this.lastDigest = digest;
    if (this.error) this.log.info('pods file is valid again');
    this.error = undefined;
    this.cache.replaceAll(pods);
    this.log.info({ pods: pods.length }, 'pods file loaded');
  }

  private fail(error: FileSourceError): void {
    const same = this.error?.message === error.message && this.error.line === error.line;
    this.error = error;
    this.lastDigest = undefined; // fixing the file back to the last good text must reload
    if (!same) {
      this.log.error({ line: error.line, column: error.column, reason: error.message }, 'pods file rejected; keeping the last good state');
    }
  }

  private async fingerprint(): Promise<string> {
    const s = await stat(this.path, { bigint: true });
    return `${s.ino}:${s.size}:${s.mtimeNs}`;
  }
}
