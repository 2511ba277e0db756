// What test:kernels shows while it works (issue 18: it printed nothing but
// JSON log lines for 15 minutes per kernel). On a TTY, one status line that
// is rewritten every second: the kernel (n/N), the step running and for how
// long, the total elapsed time and an estimate of what is left. Otherwise,
// plain lines: one per event, one when a step starts and one when it ends,
// each with the elapsed time, so a CI log reads as a timeline.

import { fmt } from '../../../scripts/lib/progress.mjs';

export { fmt };

/**
 * @param {{ write: (s: string) => void, tty: boolean, kernels: number, now?: () => number,
 *   typicalKernelSeconds?: number }} o
 */
export function createProgress(o) {
  const now = o.now ?? (() => Date.now());
  const t0 = now();
  /** @type {{ id: string, index: number, start: number } | null} */ let kernel = null;
  /** @type {{ name: string, start: number } | null} */ let step = null;
  /** @type {number[]} */ const done = [];
  let statusShown = false;
  const elapsed = () => (now() - t0) / 1000;
  const clear = () => {
    if (o.tty && statusShown) o.write('\r\x1b[2K');
    statusShown = false;
  };
  const line = (/** @type {string} */ s) => {
    clear();
    o.write(`test:kernels ${fmt(elapsed()).padStart(6)}  ${s}\n`);
    if (o.tty) status();
  };
  /** Seconds left: the kernels done so far set the pace (else the typical time). */
  const remaining = () => {
    const per = done.length > 0 ? done.reduce((a, b) => a + b, 0) / done.length : o.typicalKernelSeconds;
    if (per === undefined) return null;
    const inKernel = kernel ? (now() - kernel.start) / 1000 : 0;
    const left = (o.kernels - done.length) * per - inKernel;
    return Math.max(0, left);
  };
  const status = () => {
    if (!o.tty || !kernel) return;
    const left = remaining();
    const parts = [`[${kernel.id} ${kernel.index}/${o.kernels}]`, step ? `${step.name} ${fmt((now() - step.start) / 1000)}` : 'booting',
      `elapsed ${fmt(elapsed())}`, left === null ? '' : `~${fmt(left)} left`].filter(Boolean);
    o.write(`\r\x1b[2K${parts.join(' · ')}`);
    statusShown = true;
  };
  return {
    /** @param {string} msg @param {Record<string, unknown>} [fields] */
    log(msg, fields = {}) {
      const kv = Object.entries(fields).filter(([, v]) => v !== undefined)
        .map(([k, v]) => `${k}=${Array.isArray(v) ? v.join(',') : typeof v === 'object' && v !== null ? JSON.stringify(v) : String(v)}`);
      line(kv.length ? `${msg} (${kv.join(' ')})` : msg);
    },
    /** @param {string} id */
    kernelStart(id) {
      kernel = { id, index: done.length + 1, start: now() };
      step = null;
      line(`[${id}] kernel ${kernel.index}/${o.kernels}`);
    },
    /** @param {boolean} ok */
    kernelEnd(ok) {
      if (!kernel) return;
      const s = (now() - kernel.start) / 1000;
      done.push(s);
      clear();
      o.write(`test:kernels ${fmt(elapsed()).padStart(6)}  [${kernel.id}] ${ok ? 'done' : 'FAILED'} in ${fmt(s)}\n`);
      kernel = null;
      step = null;
    },
    /** @param {string} name */
    stepBegin(name) {
      step = { name, start: now() };
      line(`[${kernel?.id ?? '?'}] step ${name} started`);
    },
    /** @param {string} name @param {number|null} rc @param {number} seconds */
    stepEnd(name, rc, seconds) {
      step = null;
      line(`[${kernel?.id ?? '?'}] step ${name} ${rc === 0 ? 'ok' : rc === null ? 'did not finish' : `exit ${rc}`} in ${fmt(seconds)}`);
    },
    /** TTY: refresh the status line (call every second). */
    tick: status,
    /** Before the summary: remove the status line. */
    stop: clear,
  };
}
