// Parses Pod manifests as kubectl accepts them: YAML or JSON, one object, many
// `---` documents, or a List/PodList. Errors carry the line, for the operator.
import { LineCounter, parseAllDocuments, isNode, type Document } from 'yaml';
import type { V1Pod } from '@kubernetes/client-node';
import { isObject } from '../mesh/vocabulary.js';
import { podShapeProblem } from './pod-shape.js';

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

export function parsePodManifests(text: string, file: string): ParsedManifests {
  const lineCounter = new LineCounter();
  const docs = parseAllDocuments(text, { lineCounter, prettyErrors: true, uniqueKeys: true });
  const lineOf = (offset: number | undefined) => (offset === undefined ? undefined : lineCounter.linePos(offset));
  const result: ParsedManifests = { pods: [], skipped: [] };
  const list = Array.isArray(docs) ? docs : [];

  for (const doc of list) {
    const err = doc.errors[0];
    if (err) {
      const pos = err.linePos?.[0] ?? lineOf(err.pos[0]);
      throw new ManifestError(file, pos?.line, pos?.col, firstLine(err.message));
    }
  }

  for (const doc of list) {
    const value: unknown = doc.toJS({ maxAliasCount: 100 });
    if (value === null || value === undefined) continue; // empty document
    const docLine = lineOf(doc.contents?.range?.[0])?.line;
    if (!isObject(value)) throw new ManifestError(file, docLine, undefined, 'expected a Kubernetes object (a mapping)');

    const kind = typeof value.kind === 'string' ? value.kind : undefined;
    if (kind === 'List' || kind === 'PodList' || (kind === undefined && Array.isArray(value.items))) {
      if (!Array.isArray(value.items)) throw new ManifestError(file, docLine, undefined, `${kind} has no items array`);
      value.items.forEach((item, i) => collect(item, itemLine(doc, i, lineOf) ?? docLine));
    } else {
      collect(value, docLine);
    }
  }
  return result;

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
    result.pods.push(pod);
  }
}

function itemLine(doc: Document, i: number, lineOf: (o: number | undefined) => { line: number } | undefined): number | undefined {
  const node = doc.getIn(['items', i], true);
  return isNode(node) ? lineOf(node.range?.[0])?.line : undefined;
}

function firstLine(s: string): string {
  return s.split('\n')[0] ?? s;
}
