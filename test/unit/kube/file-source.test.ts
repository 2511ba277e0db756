import { mkdtemp, rename, rm, unlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { pino } from 'pino';

const quiet = pino({ level: 'silent' });
import type { V1Pod } from '@kubernetes/client-node';
import { FileSource } from '../../../src/kube/file-source.js';
import type { PodEventType } from '../../../src/kube/pod-source.js';

const podYaml = (name: string, ns?: string, extra = '') =>
  `apiVersion: v1\nkind: Pod\nmetadata:\n  name: ${name}\n${ns ? `  namespace: ${ns}\n` : ''}${extra}spec:\n  containers:\n  - name: app\n`;

function collectLogs() {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk, _enc, cb) {
      for (const l of String(chunk).split('\n')) if (l) lines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  });
  return { logger: pino({ level: 'debug' }, stream), lines };
}

/** Resolves with the next `n` change events (bounded by the test timeout). */
function nextEvents(src: FileSource, n: number): Promise<string[]> {
  return new Promise((resolve) => {
    const seen: string[] = [];
    const l = (type: PodEventType, pod: V1Pod) => {
      seen.push(`${type} ${pod.metadata!.namespace}/${pod.metadata!.name}`);
      if (seen.length === n) {
        src.off('change', l);
        resolve(seen);
      }
    };
    src.on('change', l);
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('FileSource', () => {
  let dir: string;
  let file: string;
  let src: FileSource | undefined;

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'meshcap-pods-'));
    file = join(dir, 'pods.yaml');
  });
  afterEach(async () => {
    await src?.stop();
    src = undefined;
    await rm(dir, { recursive: true, force: true });
  });

  it('loads multi-document YAML on start, then follows adds, changes and deletes', async () => {
    await writeFile(file, `${podYaml('a')}---\n${podYaml('b', 'shop')}`);
    src = new FileSource({ logger: quiet, path: file, debounceMs: 10, pollIntervalMs: 5000 });
    const initial = nextEvents(src, 2);
    await src.start();
    expect(src.synced()).toBe(true);
    expect((await initial).sort()).toEqual(['ADDED default/a', 'ADDED shop/b']);
    expect(src.get('default', 'a')?.spec?.containers[0]?.name).toBe('app');

    const changes = nextEvents(src, 3);
    await writeFile(file, `${podYaml('b', 'shop', '  labels: {v: "2"}\n')}---\n${podYaml('c')}`);
    expect((await changes).sort()).toEqual(['ADDED default/c', 'DELETED default/a', 'MODIFIED shop/b']);
    expect(src.get('shop', 'b')?.metadata?.labels).toEqual({ v: '2' });
    expect(src.get('default', 'a')).toBeUndefined();
    expect(src.list()).toHaveLength(2);
  });

  it('reads a JSON List and follows an editor-style rename-replace', async () => {
    const list = (names: string[]) => JSON.stringify({ apiVersion: 'v1', kind: 'List', items: names.map((n) => ({ kind: 'Pod', metadata: { name: n, namespace: 'j' } })) });
    await writeFile(file, list(['x', 'y']));
    src = new FileSource({ logger: quiet, path: file, debounceMs: 10, pollIntervalMs: 5000 });
    await src.start();
    expect(src.list().map((p) => p.metadata!.name).sort()).toEqual(['x', 'y']);

    const changes = nextEvents(src, 2);
    await writeFile(join(dir, '.pods.yaml.swp'), list(['y', 'z']));
    await rename(join(dir, '.pods.yaml.swp'), file);
    expect((await changes).sort()).toEqual(['ADDED j/z', 'DELETED j/x']);
  });

  it('keeps the last good state on a syntax error, logs file and line, recovers when fixed', async () => {
    const { logger, lines } = collectLogs();
    await writeFile(file, podYaml('a'));
    src = new FileSource({ path: file, logger, debounceMs: 10, pollIntervalMs: 5000 });
    await src.start();
    const events: string[] = [];
    src.on('change', (t, p) => events.push(`${t} ${p.metadata!.name}`));

    await writeFile(file, `${podYaml('a')}---\nkind: Pod\nmetadata:\n  name: b\n  labels: {x: 1\n`);
    await until(() => src!.lastError() !== undefined);
    const err = src.lastError()!;
    expect(err.line).toBeGreaterThanOrEqual(10);
    expect(src.get('default', 'a')).toBeDefined();
    expect(src.get('default', 'b')).toBeUndefined();
    expect(events).toEqual([]);
    const logged = lines.find((l) => l.msg === 'pods file rejected; keeping the last good state');
    expect(logged).toMatchObject({ level: 50, file, line: err.line });

    await writeFile(file, `${podYaml('a')}---\n${podYaml('b')}`);
    await until(() => events.length === 1);
    expect(events).toEqual(['ADDED b']);
    expect(src.lastError()).toBeUndefined();
  });

  it('rejects start() on a broken or missing file, naming the file and line', async () => {
    await writeFile(file, 'kind: Pod\nmetadata:\n  name: [\n');
    await expect(new FileSource({ logger: quiet, path: file }).start()).rejects.toThrow(new RegExp(`^${file}:\\d+:\\d+: `));
    await expect(new FileSource({ logger: quiet, path: join(dir, 'nope.yaml') }).start()).rejects.toThrow(/cannot read pods file .*nope\.yaml: ENOENT/);
  });

  it('keeps the pods when the file disappears, and picks up its return', async () => {
    await writeFile(file, podYaml('a'));
    src = new FileSource({ logger: quiet, path: file, debounceMs: 10, pollIntervalMs: 5000 });
    await src.start();
    await unlink(file);
    await until(() => src!.lastError()?.message === 'pods file is missing');
    expect(src.get('default', 'a')).toBeDefined();
    const added = nextEvents(src, 1);
    await writeFile(file, `${podYaml('a')}---\n${podYaml('n')}`);
    expect(await added).toEqual(['ADDED default/n']);
  });

  it('waitFor resolves when the pod appears later, or undefined after the timeout', async () => {
    await writeFile(file, podYaml('a'));
    src = new FileSource({ logger: quiet, path: file, debounceMs: 10, pollIntervalMs: 5000 });
    await src.start();
    expect((await src.waitFor('default', 'a', 10))?.metadata?.name).toBe('a');

    const t0 = Date.now();
    expect(await src.waitFor('default', 'ghost', 50)).toBeUndefined();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(45);

    const late = src.waitFor('late', 'p', 5000);
    await sleep(30);
    await writeFile(file, `${podYaml('a')}---\n${podYaml('p', 'late')}`);
    expect((await late)?.metadata?.namespace).toBe('late');

    const pending = src.waitFor('never', 'p', 5000);
    await src.stop();
    expect(await pending).toBeUndefined();
  });

  it('follows the file by mtime polling alone when watching is off', async () => {
    await writeFile(file, podYaml('a'));
    src = new FileSource({ logger: quiet, path: file, debounceMs: 10, pollIntervalMs: 30, watch: false });
    await src.start();
    const changed = nextEvents(src, 2);
    await writeFile(file, podYaml('b'));
    expect((await changed).sort()).toEqual(['ADDED default/b', 'DELETED default/a']);
  });
});

async function until(cond: () => boolean, timeoutMs = 3000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await sleep(5);
  }
}
