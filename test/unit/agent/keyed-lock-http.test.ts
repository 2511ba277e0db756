import { describe, expect, it } from 'vitest';
import { KeyedLock } from '../../../src/agent/keyed-lock.js';
import { parseListenAddress } from '../../../src/agent/http.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('KeyedLock', () => {
  it('runs work for one key one at a time, in order, and other keys concurrently', async () => {
    const lock = new KeyedLock();
    const log: string[] = [];
    const job = (key: string, tag: string, ms: number) => lock.run(key, async () => {
      log.push(`${tag}+`);
      await sleep(ms);
      log.push(`${tag}-`);
      return tag;
    });
    const all = Promise.all([job('a', 'a1', 30), job('a', 'a2', 1), job('b', 'b1', 5)]);
    expect([lock.holds('a'), lock.holds('b'), lock.holds('c')]).toEqual([true, true, false]);
    const r = await all;
    await new Promise((r) => setImmediate(r));
    expect([lock.holds('a'), lock.holds('b')]).toEqual([false, false]);
    expect(r).toEqual(['a1', 'a2', 'b1']);
    expect(log.indexOf('a1-')).toBeLessThan(log.indexOf('a2+'));
    expect(log.indexOf('b1-')).toBeLessThan(log.indexOf('a1-')); // b did not wait for a
    expect(lock.busy).toBe(0);
  });

  it('keeps going after a failure, and hands the failure to its caller', async () => {
    const lock = new KeyedLock();
    const failed = lock.run('a', async () => { throw new Error('boom'); });
    const next = lock.run('a', async () => 'ok');
    await expect(failed).rejects.toThrow('boom');
    await expect(next).resolves.toBe('ok');
  });

  it('starts work on a free key at once, and a synchronous throw is a rejection that frees the key', async () => {
    const lock = new KeyedLock();
    let started = false;
    const p = lock.run('a', async () => { started = true; });
    expect(started).toBe(true); // no promise hop before a free key's work
    await p;
    const thrown = lock.run('a', (() => { throw new Error('sync'); }) as () => Promise<void>);
    await expect(thrown).rejects.toThrow('sync');
    await expect(lock.run('a', async () => 'after')).resolves.toBe('after');
    await new Promise((r) => setImmediate(r));
    expect(lock.busy).toBe(0);
  });
});

describe('parseListenAddress', () => {
  it('reads HOST:PORT, [v6]:PORT and :PORT', () => {
    expect(parseListenAddress('127.0.0.1:15014')).toEqual({ host: '127.0.0.1', port: 15014 });
    expect(parseListenAddress('[::1]:9')).toEqual({ host: '::1', port: 9 });
    expect(parseListenAddress(':15014')).toEqual({ host: undefined, port: 15014 });
  });
  it('refuses anything else, naming the flag', () => {
    for (const bad of ['15014', 'host', 'a:b', '1.2.3.4:70000', '::1:80']) expect(() => parseListenAddress(bad)).toThrow(/--metrics-addr/);
  });
});
