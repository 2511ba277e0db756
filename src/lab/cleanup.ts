// The cleanup registry: everything a lab (the sandbox, a bench, a test)
// creates registers its undo right after it exists; run() undoes them in
// reverse order, each once, and keeps going past failures (a half-cleaned
// machine is worse than a report of the one step that failed).
//
// Last resort, for a process that exits without running its registry (an
// uncaught error, process.exit): undos registered with atExit run
// synchronously in the 'exit' event. SIGKILL leaves things behind; the
// names carry the owner's pid or run id so a later run can find them.

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

const atExitUndos = new Map<number, () => void>();
let nextAtExit = 0;
let exitHooked = false;

/** Run `undo` (synchronous, best effort) when the process exits, unless the returned function is called first. */
export function atExit(undo: () => void): () => void {
  if (!exitHooked) {
    exitHooked = true;
    process.once('exit', () => {
      for (const u of [...atExitUndos.values()].reverse()) {
        try {
          u();
        } catch {
          /* best effort: the process is going away */
        }
      }
    });
  }
  const id = nextAtExit++;
  atExitUndos.set(id, undo);
  return () => {
    atExitUndos.delete(id);
  };
}

export const SIGNAL_EXIT: Record<string, number> = { SIGINT: 130, SIGTERM: 143, SIGHUP: 129 };

/**
 * For scripts (benches) that end on a signal: the first SIGINT/SIGTERM/SIGHUP
 * runs `cleanup` and exits 128+n; later ones only say that cleanup is under
 * way (a second Ctrl-C must not leave namespaces and pins behind). Returns
 * the uninstaller.
 */
export function cleanupOnSignals(cleanup: () => Promise<unknown>, say: (msg: string) => void): () => void {
  let busy = false;
  const handler = (sig: NodeJS.Signals) => {
    if (busy) return say(`${sig}: still cleaning up, please wait`);
    busy = true;
    say(`${sig}: stopping and removing everything this run created`);
    void cleanup().catch((e: unknown) => say(`cleanup: ${(e as Error).message}`)).finally(() => process.exit(SIGNAL_EXIT[sig] ?? 1));
  };
  const sigs: NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];
  for (const s of sigs) process.on(s, handler);
  return () => {
    for (const s of sigs) process.off(s, handler);
  };
}
