// A storm of signals at this process, for what the kernel gives up on while
// a signal is pending (the BPF verifier's EAGAIN).
import { isMainThread, Worker } from 'node:worker_threads';

/**
 * SIGUSR2 sent to this process as fast as a worker thread can (a bounded
 * number of seconds at most) until stop(): the verifier gives up with EAGAIN
 * on a pending signal, which the addon holds off for its loads
 * (native/addon/src/common.h, SignalsHeld). Resolves once the first signal
 * is sent; stop() resolves to how many were.
 */
export async function signalStorm(maxMs = 30_000): Promise<{ stop(): Promise<number> }> {
  // signals reach process.on only on the process's main thread (vitest's forks pool)
  if (!isMainThread) throw new Error('signalStorm needs the process main thread (a handler is installed with process.on)');
  const onSignal = () => undefined;
  process.on('SIGUSR2', onSignal);
  const stopFlag = new Int32Array(new SharedArrayBuffer(4));
  const w = new Worker(
    `const { workerData, parentPort } = require('node:worker_threads');
     const stop = new Int32Array(workerData.sab);
     const end = Date.now() + workerData.maxMs;
     let n = 0;
     while (Atomics.load(stop, 0) === 0 && Date.now() < end) {
       process.kill(workerData.pid, 'SIGUSR2');
       if (n++ === 0) parentPort.postMessage('started');
     }
     parentPort.postMessage(n);`,
    { eval: true, workerData: { pid: process.pid, sab: stopFlag.buffer, maxMs } },
  );
  const sent = new Promise<number>((resolve, reject) => {
    w.on('message', (m) => typeof m === 'number' && resolve(m));
    w.once('error', reject);
  });
  await new Promise<void>((resolve, reject) => {
    w.on('message', (m) => m === 'started' && resolve());
    w.once('error', reject);
  });
  return {
    async stop() {
      Atomics.store(stopFlag, 0, 1);
      try {
        return await sent;
      } finally {
        await w.terminate();
        // the last signals sent may still be queued for the event loop
        await new Promise((r) => setTimeout(r, 50));
        process.off('SIGUSR2', onSignal);
      }
    },
  };
}
