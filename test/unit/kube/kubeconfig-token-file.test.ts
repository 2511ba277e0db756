// loadKubeConfig(file) with a token file: the token is re-read, not frozen at
// load (client-node alone reads `token-file` once and ignores client-go's
// `tokenFile`). The real-server rotation test is test/k8s/api-source.real.test.ts.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { loadKubeConfig } from '../../../src/kube/api-source.js';

describe('loadKubeConfig with a token file', () => {
  let dir: string | undefined;
  afterEach(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
    dir = undefined;
  });

  const write = (userLine: string) => {
    dir ??= mkdtempSync(path.join(tmpdir(), 'meshcap-kc-'));
    const file = path.join(dir, 'kubeconfig');
    writeFileSync(file, [
      'apiVersion: v1', 'kind: Config', 'current-context: c',
      'clusters:', '- name: k', '  cluster: {server: "https://127.0.0.1:6443"}',
      'users:', '- name: u', `  user: ${userLine}`,
      'contexts:', '- name: c', '  context: {cluster: k, user: u}', '',
    ].join('\n'));
    writeFileSync(path.join(dir, 'token'), 'first');
    return file;
  };
  const bearer = async (file: string) => {
    const kc = loadKubeConfig(file);
    const opts = await kc.applyToFetchOptions({});
    return { kc, auth: (opts.headers as unknown as Headers).get('Authorization') };
  };

  it.each([
    // client-go's key, relative to the kubeconfig as client-go resolves it
    ['tokenFile: token', () => '{tokenFile: token}'],
    // client-node's own key (which it reads relative to the cwd, so absolute here)
    ['token-file: /abs/token', (d: string) => `{token-file: "${path.join(d, 'token')}"}`],
  ])('%s uses the re-reading token-file authenticator', async (_name, userLine) => {
    dir = mkdtempSync(path.join(tmpdir(), 'meshcap-kc-'));
    const file = write(userLine(dir));
    const { kc, auth } = await bearer(file);
    expect(auth).toBe('Bearer first');
    const user = kc.getCurrentUser()!;
    expect(user.token).toBeUndefined();
    expect(user.authProvider).toEqual({ name: 'tokenFile', config: { tokenFile: path.join(dir!, 'token') } });
  });

  it('reads the file again after client-node\'s 60 s interval: a rotated token is used (client-node alone keeps the first)', async () => {
    const file = write('{tokenFile: token}');
    const { kc, auth } = await bearer(file);
    expect(auth).toBe('Bearer first');
    writeFileSync(path.join(dir!, 'token'), 'second');
    vi.useFakeTimers({ toFake: ['Date'], now: Date.now() + 61_000 }); // past client-node's 60 s re-read interval
    try {
      const opts = await kc.applyToFetchOptions({});
      expect((opts.headers as unknown as Headers).get('Authorization')).toBe('Bearer second');
    } finally {
      vi.useRealTimers();
    }
  });

  it('leaves a static token alone', async () => {
    const { kc, auth } = await bearer(write('{token: static}'));
    expect(auth).toBe('Bearer static');
    expect(kc.getCurrentUser()!.authProvider).toBeUndefined();
  });
});
