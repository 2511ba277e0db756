// The in-memory pod set shared by every PodSource: applies changes, emits
// ADDED/MODIFIED/DELETED exactly once per real change, and wakes waitFor().
// It keeps each pod's compact view (pod-view.ts), never the object it was given.
import { EventEmitter } from 'node:events';
import { isDeepStrictEqual } from 'node:util';
import type { V1Pod } from '@kubernetes/client-node';
import { podKey, podNamespace, type PodChangeListener, type PodEventType } from './pod-source.js';
import { podView, ShapePool, StringPool } from './pod-view.js';

interface Waiter {
  resolve(pod: V1Pod | undefined): void;
  timer: NodeJS.Timeout;
}

export class PodCache {
  private readonly pods = new Map<string, V1Pod>();
  private readonly waiters = new Map<string, Set<Waiter>>();
  private readonly events = new EventEmitter<{ change: [PodEventType, V1Pod] }>();
  private readonly strings = new StringPool();
  private readonly shapes = new ShapePool();

  /** The compact view this cache keeps of `pod` (sources may take it early, to drop the whole object sooner). */
  view(pod: V1Pod): V1Pod {
    return podView(pod, this.strings, this.shapes);
  }

  get size(): number {
    return this.pods.size;
  }

  get(namespace: string, name: string): V1Pod | undefined {
    return this.pods.get(podKey(namespace, name));
  }

  list(): V1Pod[] {
    return [...this.pods.values()];
  }

  on(listener: PodChangeListener): void {
    this.events.on('change', listener);
  }

  off(listener: PodChangeListener): void {
    this.events.off('change', listener);
  }

  /** ADDED or MODIFIED (or nothing, if the pod did not change). */
  upsert(whole: V1Pod): void {
    const key = keyOf(whole);
    const pod = this.view(whole);
    const old = this.pods.get(key);
    if (old && samePod(old, pod)) return;
    this.pods.set(key, pod);
    this.emit(old ? 'MODIFIED' : 'ADDED', pod);
    this.wake(key, pod);
  }

  /** DELETED with the last state the cache had, if it had the pod. */
  remove(whole: V1Pod): void {
    const key = keyOf(whole);
    if (!this.pods.delete(key)) return;
    this.emit('DELETED', this.view(whole));
  }

  /**
   * Makes the cache equal to `pods` (a file reload, an API relist), emitting
   * only the differences, deletions first.
   */
  replaceAll(pods: readonly V1Pod[]): void {
    const next = new Map<string, V1Pod>();
    for (const pod of pods) next.set(keyOf(pod), pod);
    for (const [key, old] of this.pods) {
      if (!next.has(key)) {
        this.pods.delete(key);
        this.emit('DELETED', old);
      }
    }
    for (const pod of next.values()) this.upsert(pod);
  }

  waitFor(namespace: string, name: string, timeoutMs: number): Promise<V1Pod | undefined> {
    const key = podKey(namespace, name);
    const now = this.pods.get(key);
    if (now) return Promise.resolve(now);
    return new Promise((resolve) => {
      const set = this.waiters.get(key) ?? new Set<Waiter>();
      this.waiters.set(key, set);
      const waiter: Waiter = {
        resolve,
        timer: setTimeout(() => {
          set.delete(waiter);
          if (set.size === 0) this.waiters.delete(key);
          resolve(undefined);
        }, timeoutMs),
      };
      set.add(waiter);
    });
  }

  /** Resolves every pending waitFor with undefined (the source is stopping). */
  cancelWaiters(): void {
    for (const set of this.waiters.values()) {
      for (const w of set) {
        clearTimeout(w.timer);
        w.resolve(undefined);
      }
    }
    this.waiters.clear();
  }

  private wake(key: string, pod: V1Pod): void {
    const set = this.waiters.get(key);
    if (!set) return;
    this.waiters.delete(key);
    for (const w of set) {
      clearTimeout(w.timer);
      w.resolve(pod);
    }
  }

  private emit(type: PodEventType, pod: V1Pod): void {
    // A throwing listener must not corrupt the cache or stop other listeners.
    for (const listener of this.events.listeners('change') as PodChangeListener[]) {
      try {
        listener(type, pod);
      } catch (err) {
        process.nextTick(() => { throw err; });
      }
    }
  }
}

function keyOf(pod: V1Pod): string {
  const name = pod.metadata?.name;
  if (!name) throw new Error('pod has no metadata.name');
  return podKey(podNamespace(pod), name);
}

// The API server bumps resourceVersion on every change, so equal versions mean
// the same object (a relist repeats unchanged pods). Without versions (pods
// from a file) compare the content.
function samePod(a: V1Pod, b: V1Pod): boolean {
  const ra = a.metadata?.resourceVersion;
  const rb = b.metadata?.resourceVersion;
  if (ra && rb) return ra === rb;
  return isDeepStrictEqual(a, b);
}

/**
 * The read side every pod source shares: lookups, waits and change events are
 * served from one PodCache; subclasses fill it and set `stopped`.
 */
export abstract class CachedPodSource {
  protected readonly cache = new PodCache();
  protected stopped = false;

  get(namespace: string, name: string): V1Pod | undefined {
    return this.cache.get(namespace, name);
  }

  list(): V1Pod[] {
    return this.cache.list();
  }

  waitFor(namespace: string, name: string, timeoutMs: number): Promise<V1Pod | undefined> {
    if (this.stopped) return Promise.resolve(this.get(namespace, name));
    return this.cache.waitFor(namespace, name, timeoutMs);
  }

  on(_event: 'change', listener: PodChangeListener): this {
    this.cache.on(listener);
    return this;
  }

  off(_event: 'change', listener: PodChangeListener): this {
    this.cache.off(listener);
    return this;
  }
}
