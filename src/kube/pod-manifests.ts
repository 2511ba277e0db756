// Parses Pod manifests as kubectl accepts them: YAML or JSON, one object, many
// `---` documents, or a List/PodList. Errors carry the line, for the operator.
import { createRequire } from 'node:module';
import type { Document, LineCounter } from 'yaml';
import type { V1Pod } from '@kubernetes/client-node';
import { isObject } from '../mesh/vocabulary.js';
import { podShapeProblem } from './pod-shape.js';

/** The YAML parser, loaded on first use: a JSON file (and the agent's start with one) never needs it (~100 ms to load). */
let yamlLib: typeof import('yaml') | undefined;
const yaml = (): typeof import('yaml') => (yamlLib ??= createRequire(import.meta.url)('yaml') as typeof import('yaml'));

export class ManifestError extends Error {
  constructor(
    readonly file: string,
    readonly line: number | undefined,
    readonly column: number | undefined,
    readonly detail: string,
  ) {
    super(`${file}${line !== undefined ? `:${line}${column !== undefined ? `:${column}` : ''}` : ''}: ${detail}`);
    this.name = 'ManifestError';
  }
}

export interface ParsedManifests {
  pods: V1Pod[];
  /** Objects of other kinds (Services, Deployments...), ignored. */
  skipped: { kind: string; line: number | undefined }[];
}

/**
 * The pods of a manifest file. `view` (the pod cache's compact view) is
 * applied to each pod as soon as its document is read, so with a `---`
 * stream of 10,000 pods only one document's objects and parse tree are alive
 * at a time, never the whole file's. (A List is one document: it is read
 * whole.) A file with any error is read again the whole-file way, which
 * names the error exactly as before (a syntax error anywhere before a
 * missing name in an earlier document).
 */
export function parsePodManifests(text: string, file: string, view?: (pod: V1Pod) => V1Pod): ParsedManifests {
  try {
    // JSON (an API server's pod list, a `kubectl get -o json`): JSON.parse is
    // ~100x faster than the YAML parser (1,000 pods: 2 ms instead of ~200-400 ms
    // of the agent's start). Any problem is named by the YAML path below.
    const json = jsonValue(text);
    if (json !== undefined) {
      const result: ParsedManifests = { pods: [], skipped: [] };
      readValue(file, result, view, json, undefined, () => undefined);
      return result;
    }
    return readDocuments(file, streamDocuments(text), view);
  } catch (err) {
    if (!(err instanceof ManifestError)) throw err;
    const pretty = new (yaml().LineCounter)();
    const docs = yaml().parseAllDocuments(text, { lineCounter: pretty, prettyErrors: true, uniqueKeys: true });
    readDocuments(file, { docs: Array.isArray(docs) ? docs : [], lineCounter: pretty, checkFirst: true });
    throw err;
  }
}

interface DocumentSource {
  docs: Iterable<Document.Parsed>;
  lineCounter: LineCounter;
  /** All documents' syntax errors before any content (the whole-file way). */
  checkFirst?: boolean;
}

/** Documents one at a time, as the composer finishes them (parseAllDocuments gathers them all first). */
function streamDocuments(text: string): DocumentSource {
  const { Composer, LineCounter, Parser } = yaml();
  const lineCounter = new LineCounter();
  const parser = new Parser(lineCounter.addNewLine);
  const composer = new Composer({ uniqueKeys: true });
  return { docs: composer.compose(parser.parse(text)), lineCounter };
}

function readDocuments(file: string, src: DocumentSource, view?: (pod: V1Pod) => V1Pod): ParsedManifests {
  const { lineCounter } = src;
  const lineOf = (offset: number | undefined) => (offset === undefined ? undefined : lineCounter.linePos(offset));
  const result: ParsedManifests = { pods: [], skipped: [] };
  const syntax = (doc: Document.Parsed) => {
    const err = doc.errors[0];
    if (err) {
      const pos = err.linePos?.[0] ?? lineOf(err.pos[0]);
      throw new ManifestError(file, pos?.line, pos?.col, firstLine(err.message));
    }
  };
  if (src.checkFirst) for (const doc of src.docs) syntax(doc);

  for (const doc of src.docs) {
    syntax(doc);
    const value: unknown = doc.toJS({ maxAliasCount: 100 });
    if (value === null || value === undefined) continue; // empty document
    const docLine = lineOf(doc.contents?.range?.[0])?.line;
    if (!isObject(value)) throw new ManifestError(file, docLine, undefined, 'expected a Kubernetes object (a mapping)');

    readValue(file, result, view, value, docLine, (i) => itemLine(doc, i, lineOf));
  }
  return result;
}

/** One document's object: a List's pods, or one object. */
function readValue(file: string, result: ParsedManifests, view: ((pod: V1Pod) => V1Pod) | undefined, value: Record<string, unknown>, docLine: number | undefined, itemLineOf: (i: number) => number | undefined): void {
  const kind = typeof value.kind === 'string' ? value.kind : undefined;
  if (kind === 'List' || kind === 'PodList' || (kind === undefined && Array.isArray(value.items))) {
    if (!Array.isArray(value.items)) throw new ManifestError(file, docLine, undefined, `${kind} has no items array`);
    value.items.forEach((item, i) => collect(item, itemLineOf(i) ?? docLine));
  } else {
    collect(value, docLine);
  }

  function collect(obj: unknown, line: number | undefined): void {
    if (!isObject(obj)) throw new ManifestError(file, line, undefined, 'expected a Kubernetes object (a mapping)');
    const kind = obj.kind;
    if (kind !== undefined && kind !== 'Pod') {
      result.skipped.push({ kind: String(kind), line });
      return;
    }
    const metadata = obj.metadata;
    if (!isObject(metadata) || typeof metadata.name !== 'string' || metadata.name === '') {
      throw new ManifestError(file, line, undefined, 'Pod has no metadata.name');
    }
    if (metadata.namespace !== undefined && (typeof metadata.namespace !== 'string' || metadata.namespace === '')) {
      throw new ManifestError(file, line, undefined, `Pod ${metadata.name}: metadata.namespace must be a non-empty string`);
    }
    // The API server would refuse a pod whose fields have the wrong type (an
    // unquoted number as an annotation value, `containers: 5`); without this
    // the first ADD for it fails with JavaScript internals.
    const problem = podShapeProblem(obj);
    if (problem) throw new ManifestError(file, line, undefined, `Pod ${metadata.name}: ${problem}`);
    const pod = obj as V1Pod;
    if (metadata.namespace === undefined) pod.metadata = { ...pod.metadata, namespace: 'default' };
    result.pods.push(view ? view(pod) : pod);
  }
}

/**
 * The text as one JSON object, when it is one and has no key twice in an
 * object (JSON.parse keeps the last; the YAML path rejects it, as kubectl's
 * strict validation does): its keys are counted in the text (a valid JSON
 * text's strings followed by a colon) and in the parsed objects.
 */
function jsonValue(text: string): Record<string, unknown> | undefined {
  if (!/^\s*\{/.test(text)) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (!isObject(value)) return undefined;
  let inText = 0;
  for (const m of text.matchAll(/"(?:[^"\\]|\\.)*"\s*(:)?/g)) if (m[1]) inText++;
  let parsed = 0;
  const count = (v: unknown): void => {
    if (Array.isArray(v)) v.forEach(count);
    else if (v !== null && typeof v === 'object') {
      for (const k of Object.keys(v)) {
        parsed++;
        count((v as Record<string, unknown>)[k]);
      }
    }
  };
  count(value);
  return inText === parsed ? value : undefined;
}

function itemLine(doc: Document, i: number, lineOf: (o: number | undefined) => { line: number } | undefined): number | undefined {
  const node = doc.getIn(['items', i], true);
  return yaml().isNode(node) ? lineOf(node.range?.[0])?.line : undefined;
}

function firstLine(s: string): string {
  return s.split('\n')[0] ?? s;
}
