// Serialises async work per key (a CNI container id): a retried ADD, a DEL and
// a GC for the same attachment never interleave; different keys run freely.
export class KeyedLock {
  private readonly tails = new Map<string, Promise<unknown>>();

  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key);
    // Nothing queued for the key (nearly every ADD and DEL): start now, not
    // one promise hop later (fn's synchronous part runs before the tail is
    // set: nothing else runs meanwhile, and fn never takes its own key).
    const next = prev ? prev.then(fn, fn) : start(fn);
    const tail = next.catch(() => undefined);
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return next;
  }

  /** Work for the key is queued or running. */
  holds(key: string): boolean {
    return this.tails.has(key);
  }

  /** Keys with work queued or running. */
  get busy(): number {
    return this.tails.size;
  }
}

/** fn() as a promise: a synchronous throw becomes a rejection, as in a then(). */
function start<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return fn();
  } catch (err) {
    return Promise.reject(err);
  }
}
