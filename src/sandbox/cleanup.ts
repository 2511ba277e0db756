// The sandbox's side of cleanup: the registry itself is the lab's
// (src/lab/cleanup.ts); here SIGINT/SIGTERM/SIGHUP abort the run through an
// AbortSignal, so the main flow stops at its next wait and its `finally`
// runs the same cleanup.
export { Cleanup, SIGNAL_EXIT, type CleanupStep } from '../lab/cleanup.js';

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
