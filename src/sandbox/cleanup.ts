// The cleanup registry: every thing the sandbox creates registers its undo
// right after it exists; run() undoes them in reverse order, each once, and
// keeps going past failures (a half-cleaned machine is worse than a report of
// the one step that failed). SIGINT/SIGTERM/SIGHUP abort the run through an
// AbortSignal, so the main flow stops at its next wait and its `finally`
// runs the same cleanup.

export interface CleanupStep {
  label: string;
  error?: string;
  ms: number;
}

type Undo = () => Promise<unknown> | unknown;

export class Cleanup {
  private readonly steps: { label: string; undo: Undo }[] = [];
  private running: Promise<CleanupStep[]> | undefined;

  /** Register the undo of something that now exists. */
  add(label: string, undo: Undo): void {
    if (this.running) throw new Error(`cleanup already running: ${label} was created too late and must be removed by hand`);
    this.steps.push({ label, undo });
  }

  get size(): number {
    return this.steps.length;
  }

  /** Undo everything, last first. A second call returns the first call's result. */
  run(onStep?: (s: CleanupStep) => void): Promise<CleanupStep[]> {
    this.running ??= (async () => {
      const done: CleanupStep[] = [];
      for (const s of [...this.steps].reverse()) {
        const t0 = performance.now();
        let error: string | undefined;
        try {
          await s.undo();
        } catch (e) {
          error = e instanceof Error ? e.message : String(e);
        }
        const step: CleanupStep = { label: s.label, ms: Math.round(performance.now() - t0), ...(error ? { error } : {}) };
        done.push(step);
        onStep?.(step);
      }
      return done;
    })();
    return this.running;
  }
}

export const SIGNAL_EXIT: Record<string, number> = { SIGINT: 130, SIGTERM: 143, SIGHUP: 129 };

/**
 * Turn the first of SIGINT/SIGTERM/SIGHUP into an abort; later ones only say
 * that cleanup is under way (a second Ctrl-C must not leave pins and bridges
 * behind by killing the process mid-cleanup). Returns the uninstaller.
 */
export function abortOnSignals(ctl: AbortController, say: (msg: string) => void): () => void {
  const handler = (sig: NodeJS.Signals) => {
    if (!ctl.signal.aborted) {
      say(`${sig}: stopping and removing everything the sandbox created`);
      ctl.abort(new SignalAbort(sig));
    } else {
      say(`${sig}: still cleaning up, please wait`);
    }
  };
  const sigs: NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];
  for (const s of sigs) process.on(s, handler);
  return () => {
    for (const s of sigs) process.off(s, handler);
  };
}

export class SignalAbort extends Error {
  constructor(readonly signal: NodeJS.Signals) {
    super(`interrupted by ${signal}`);
    this.name = 'SignalAbort';
  }
}

/** Resolves after ms, rejects with the abort reason as soon as the signal aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** p, rejected with the abort reason if the signal aborts first. */
export function abortable<T>(p: Promise<T>, signal?: AbortSignal): Promise<T> {
  if (!signal) return p;
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (e) => {
        signal.removeEventListener('abort', onAbort);
        reject(e);
      },
    );
  });
}
