// The node's processes load client-node's KubeConfig and Watch from a
// tree-shaken bundle (build/kube/client-node.mjs, src/kube/client-node-entry.mjs
// says why): the package's own entry loads its whole generated API, ~28 MB
// of V8 heap the agent never used. These fail if the bundle grows the
// generated API back, or if runtime code in src/ imports the package again.
import { readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';
import { CLIENT_NODE_BUNDLE, KubeConfig, Watch, fetch } from '../../../src/kube/client-node.js';

const src = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'src');

function tsFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    return e.isDirectory() ? tsFiles(p) : e.name.endsWith('.ts') && !e.name.endsWith('.d.ts') ? [p] : [];
  });
}

describe('client-node bundle', () => {
  it('holds KubeConfig, Watch and fetch, and none of the generated API', () => {
    expect(typeof KubeConfig).toBe('function');
    expect(typeof Watch).toBe('function');
    expect(typeof fetch).toBe('function');
    const kc = new KubeConfig();
    kc.loadFromOptions({ clusters: [{ name: 'c', server: 'https://198.18.0.1:6443', skipTLSVerify: false }], users: [{ name: 'u', token: 't' }], contexts: [{ name: 'x', cluster: 'c', user: 'u' }], currentContext: 'x' });
    expect(kc.getCurrentCluster()?.server).toBe('https://198.18.0.1:6443');
    const text = readFileSync(CLIENT_NODE_BUNDLE, 'utf8');
    for (const generated of ['ObjectSerializer', 'CoreV1Api', 'AppsV1Api', 'attributeTypeMap']) expect(text, generated).not.toContain(generated);
    expect(text.length).toBeLessThan(2 << 20);
  });

  it('is the only way runtime code in src/ reaches @kubernetes/client-node (type imports aside)', () => {
    const offenders: string[] = [];
    for (const file of tsFiles(src)) {
      // compiled as tsc emits it: imports used only as types are gone
      const js = ts.transpileModule(readFileSync(file, 'utf8'), { compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 }, fileName: file }).outputText;
      if (/(?:from\s+|import\s*\(\s*|import\s+)['"]@kubernetes\/client-node(?:\/[^'"]*)?['"]/.test(js)) offenders.push(path.relative(src, file));
    }
    expect(offenders).toEqual([]);
  });
});
