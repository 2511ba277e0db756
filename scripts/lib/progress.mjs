// Progress for long work with a known number of steps (the benches; the
// kernel matrix has its own per-kernel view in test/kernels/lib/progress.mjs,
// built on fmt below). On a TTY: one status line rewritten in place, with
// the step, n/N, elapsed time and an estimate of what is left from the pace
// so far. Otherwise: one plain line per step, so a log reads as a timeline.

/** Seconds as 42s, 3m05s, 1h02m. @param {number} s */
export function fmt(s) {
  s = Math.max(0, Math.round(s));
  const m = Math.floor(s / 60);
  return m >= 60 ? `${Math.floor(m / 60)}h${String(m % 60).padStart(2, '0')}m` : m > 0 ? `${m}m${String(s % 60).padStart(2, '0')}s` : `${s}s`;
}

/**
 * write: where the status goes (stderr); out: where log() lines go (stdout: results stay pipeable).
 * @param {{ name: string, total: number, write?: (s: string) => void, out?: (s: string) => void, tty?: boolean, now?: () => number }} o
 */
export function createStepProgress(o) {
  const write = o.write ?? ((s) => process.stderr.write(s));
  const out = o.out ?? ((s) => process.stdout.write(s));
  const tty = o.tty ?? process.stderr.isTTY === true;
  const now = o.now ?? (() => Date.now());
  const t0 = now();
  let n = 0;
  let shown = false;
  const elapsed = () => (now() - t0) / 1000;
  const clear = () => {
    if (tty && shown) write('\r\x1b[2K');
    shown = false;
  };
  return {
    /** A step begins (the n-th of total). @param {string} label */
    step(label) {
      n++;
      // the pace of the steps finished before this one
      const est = n > 1 ? (elapsed() / (n - 1)) * (o.total - n + 1) : null;
      const parts = [`${o.name} [${n}/${o.total}] ${label}`, `elapsed ${fmt(elapsed())}`, est === null ? '' : `~${fmt(est)} left`].filter(Boolean);
      if (tty) {
        write(`\r\x1b[2K${parts.join(' · ')}`);
        shown = true;
      } else {
        write(`${parts.join(' · ')}\n`);
      }
    },
    /** A line that must stay (results, warnings), printed above the status line. @param {string} s */
    log(s) {
      clear();
      out(`${s}\n`);
    },
    /** The work is over: the status line goes, a summary line stays. */
    done() {
      clear();
      write(`${o.name}: ${n}/${o.total} steps in ${fmt(elapsed())}\n`);
    },
  };
}
