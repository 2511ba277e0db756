// What a pass's KeySnapshot holds at N pods, in-process on real maps: a
// datapath loaded under its own pin root (removed after), N Istio pods
// written with PodMaps.write (fake netns cookies: no netns is needed for the
// maps), then per round: snapshot() and a diff of every pod against it,
// with the V8 heap and array buffers after two full GCs before, while the
// snapshot is held, and after. An A/B runs this file from each tree.
//
//   node --expose-gc --import ./bench/lib/ts.mjs bench/scale/snapshot-heap.ts [N]   (root)
import { loadDatapath, uninstallDatapath } from '../../src/loader/datapath.js';
import { pinLayout } from '../../src/loader/manifest.js';
import { PodMaps } from '../../src/maps/registry.js';
import { istioCapture } from '../../test/helpers/pods.js';

const N = Number(process.argv[2] ?? 10_000);
const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) throw new Error('run with node --expose-gc');
const mem = () => {
  gc();
  gc();
  const m = process.memoryUsage();
  return { heap: m.heapUsed, ab: m.arrayBuffers };
};
const MiB = (x: number) => (x / 1048576).toFixed(2);
const pinRoot = `/sys/fs/bpf/meshcap-snapheap-${process.pid}`;
try {
  await loadDatapath({ pinRoot });
  const m = new PodMaps(pinLayout(pinRoot).maps);
  const cfg = istioCapture({});
  const ip = (i: number) => [`198.18.${(i >> 8) & 255}.${i & 255}`];
  // cookies above 2^32, as a busy node's are
  const cookie = (i: number) => BigInt(i) * 4099n + (1n << 33n);
  for (let i = 1; i <= N; i++) m.write(cookie(i), cfg, ip(i));
  for (let round = 1; round <= 3; round++) {
    const m0 = mem();
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    const snap = m.snapshot();
    const tSnap = performance.now() - t0;
    const m1 = mem();
    const t1 = performance.now();
    let drift = 0;
    for (let i = 1; i <= N; i++) if (m.diff(cookie(i), cfg, ip(i), snap).length > 0) drift++;
    const tDiff = performance.now() - t1;
    const c = process.cpuUsage(c0);
    const m2 = mem();
    console.log(`round ${round}, ${N} pods: snapshot ${tSnap.toFixed(1)} ms, diff of every pod ${tDiff.toFixed(1)} ms, CPU ${((c.user + c.system) / 1000).toFixed(0)} ms (both, GCs included); held by the snapshot: heap ${MiB(m1.heap - m0.heap)} MiB, array buffers ${MiB(m1.ab - m0.ab)} MiB; heap after the diffs ${MiB(m2.heap - m0.heap)} MiB; pods with drift ${drift}, pods in the snapshot ${snap.pods.size}`);
  }
  m.close();
} finally {
  uninstallDatapath(pinRoot);
}
