// The mesh vocabulary: its values are Istio's and Linkerd's (checked here
// against the literal upstream names), and it is the only place in src/ that
// spells them. Once a second copy exists, the decision and the config can
// drift apart again.
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import {
  ISTIO_ANNOTATIONS,
  ISTIO_INIT_CONTAINER,
  ISTIO_LABELS,
  ISTIO_PROXY_CONTAINER,
  ISTIO_PROXY_USER,
  LINKERD_ANNOTATIONS,
  LINKERD_INIT_CONTAINER,
  LINKERD_PROXY_CONTAINER,
  MESH_PROFILES,
  isMeshProfile,
  isObject,
  parseGoBool,
} from '../../../src/mesh/vocabulary.js';

const src = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'src');
const VOCABULARY = path.join('mesh', 'vocabulary.ts');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sourceFiles(path.join(dir, e.name)) : e.name.endsWith('.ts') ? [path.join(dir, e.name)] : []);
}

/** The code of a TypeScript file without its comments (names in prose are fine). */
function code(text: string): string {
  return text.replace(/\/\*[\s\S]*?\*\//g, '').replace(/(^|[^:'"`])\/\/.*$/gm, '$1');
}

/** Lines of src/ outside the vocabulary whose code matches re. */
function offenders(re: RegExp): string[] {
  const out: string[] = [];
  for (const f of sourceFiles(src)) {
    const rel = path.relative(src, f);
    if (rel === VOCABULARY) continue;
    code(readFileSync(f, 'utf8')).split('\n').forEach((line, i) => {
      if (re.test(line)) out.push(`src/${rel}:${i + 1}: ${line.trim()}`);
    });
  }
  return out;
}

describe('mesh vocabulary', () => {
  it('has the names the injectors and istio/api use', () => {
    expect(MESH_PROFILES).toEqual(['istio', 'linkerd']);
    expect([ISTIO_PROXY_CONTAINER, ISTIO_INIT_CONTAINER, LINKERD_PROXY_CONTAINER, LINKERD_INIT_CONTAINER])
      .toEqual(['istio-proxy', 'istio-init', 'linkerd-proxy', 'linkerd-init']);
    expect(ISTIO_PROXY_USER).toBe('istio-proxy');
    expect(ISTIO_ANNOTATIONS.status).toBe('sidecar.istio.io/status');
    expect(ISTIO_ANNOTATIONS.inject).toBe('sidecar.istio.io/inject');
    expect(ISTIO_LABELS.dataplaneMode).toBe('istio.io/dataplane-mode');
    expect(LINKERD_ANNOTATIONS.inject).toBe('linkerd.io/inject');
    for (const v of Object.values(ISTIO_ANNOTATIONS)) expect(v).toMatch(/^([a-z]+\.)*istio\.io\/[A-Za-z-]+$/);
    for (const v of Object.values(LINKERD_ANNOTATIONS)) expect(v).toMatch(/^([a-z]+\.)?linkerd\.io\/[a-z-]+$/);
  });

  it('isMeshProfile accepts the two profiles only', () => {
    for (const p of MESH_PROFILES) expect(isMeshProfile(p)).toBe(true);
    for (const x of ['Istio', 'envoy', '', undefined, null, 1]) expect(isMeshProfile(x)).toBe(false);
  });

  it('parseGoBool accepts exactly what Go strconv.ParseBool accepts', () => {
    for (const t of ['1', 't', 'T', 'TRUE', 'true', 'True']) expect(parseGoBool(t)).toBe(true);
    for (const f of ['0', 'f', 'F', 'FALSE', 'false', 'False']) expect(parseGoBool(f)).toBe(false);
    for (const x of ['', 'yes', 'tRUE', ' true', 'enabled', '2']) expect(parseGoBool(x)).toBeUndefined();
  });

  it('isObject is true for JSON objects only', () => {
    expect(isObject({})).toBe(true);
    expect(isObject({ a: 1 })).toBe(true);
    for (const x of [null, undefined, [], [{}], 'x', 1, true]) expect(isObject(x)).toBe(false);
  });

  it('no other file in src/ spells an annotation, label or container name', () => {
    expect(offenders(/['"`](?:[a-z.]*\.)?(?:istio|linkerd)\.io\//)).toEqual([]);
    expect(offenders(/['"`](?:istio|linkerd)-(?:proxy|init)['"`]/)).toEqual([]);
  });

  it('no other file in src/ defines the profile type, Go boolean parsing or isObject', () => {
    expect(offenders(/'istio'\s*\|\s*'linkerd'|'linkerd'\s*\|\s*'istio'/)).toEqual([]);
    expect(offenders(/\bfunction\s+(?:isObject|\w*[Pp]arse\w*Bool\w*)\s*[(<]/)).toEqual([]);
    expect(offenders(/\b(?:const|let)\s+(?:isObject|\w*[Pp]arse\w*Bool\w*)\s*=/)).toEqual([]);
  });

  it('the scan sees a second definition (the checks above can fail)', () => {
    expect(code("const a = 'sidecar.istio.io/status'; // in code")).toMatch(/istio\.io/);
    expect(code('// sidecar.istio.io/status in a comment')).not.toMatch(/istio\.io/);
    expect(/\bfunction\s+(?:isObject|\w*[Pp]arse\w*Bool\w*)\s*[(<]/.test('function goParseBool(v: string)')).toBe(true);
    expect(/['"`](?:[a-z.]*\.)?(?:istio|linkerd)\.io\//.test("x['config.linkerd.io/proxy-uid']")).toBe(true);
  });
});
