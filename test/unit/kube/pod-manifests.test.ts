import { describe, expect, it } from 'vitest';
import { ManifestError, parsePodManifests } from '../../../src/kube/pod-manifests.js';

function fails(text: string): ManifestError {
  try {
    parsePodManifests(text, '/etc/pods.yaml');
  } catch (err) {
    expect(err).toBeInstanceOf(ManifestError);
    return err as ManifestError;
  }
  throw new Error('expected a ManifestError');
}

describe('parsePodManifests', () => {
  it('reads multi-document YAML, skips other kinds and empty documents, defaults the namespace', () => {
    const r = parsePodManifests(
      ['apiVersion: v1', 'kind: Pod', 'metadata:', '  name: a', '---', 'kind: Service', 'metadata: {name: s}', '---', '---', 'kind: Pod', 'metadata: {name: b, namespace: x}', ''].join('\n'),
      'f',
    );
    expect(r.pods.map((p) => `${p.metadata!.namespace}/${p.metadata!.name}`)).toEqual(['default/a', 'x/b']);
    expect(r.skipped).toEqual([{ kind: 'Service', line: 6 }]);
  });

  it('reads a JSON List and a YAML PodList', () => {
    const json = parsePodManifests('{"kind":"List","items":[{"kind":"Pod","metadata":{"name":"a","namespace":"x"}},\n{"metadata":{"name":"b"}}]}', 'f');
    expect(json.pods.map((p) => p.metadata!.name)).toEqual(['a', 'b']);
    const yaml = parsePodManifests('kind: PodList\nitems:\n- metadata: {name: c}\n', 'f');
    expect(yaml.pods[0]!.metadata).toEqual({ name: 'c', namespace: 'default' });
  });

  it('reads a single JSON pod', () => {
    const r = parsePodManifests(JSON.stringify({ kind: 'Pod', metadata: { name: 'j' }, spec: { containers: [{ name: 'c' }] } }, null, 2), 'f');
    expect(r.pods[0]!.spec!.containers[0]!.name).toBe('c');
  });

  it('reads JSON the fast way and still names its problems with the line, duplicate keys included', () => {
    const pod = (name: string, extra = '') => `{"kind":"Pod","metadata":{"name":"${name}","annotations":{"a\\":\\"b":"x\\" : \\"y", "c": "{\\"d\\": 1}"}${extra}},"spec":{"containers":[{"name":"app"}]}}`;
    const list = parsePodManifests(`{"kind":"List","items":[\n${pod('a')},\n${pod('b')}]}`, 'f');
    expect(list.pods.map((p) => p.metadata!.name)).toEqual(['a', 'b']);
    expect(list.pods[0]!.metadata!.annotations).toEqual({ 'a":"b': 'x" : "y', c: '{"d": 1}' });
    expect(list.pods[0]!.metadata!.namespace).toBe('default');
    // a key twice: JSON.parse would keep the last; the file is refused as YAML refuses it
    const dup = fails(`{"kind":"List","items":[\n${pod('a')},\n${pod('b', ',"name":"c"')}]}`);
    expect(dup.line).toBe(3);
    expect(dup.detail).toMatch(/unique/i);
    const noName = fails('{"kind":"List","items":[\n{"kind":"Pod","metadata":{}}]}');
    expect([noName.line, noName.detail]).toEqual([2, 'Pod has no metadata.name']);
  });

  it('reports YAML syntax errors with file and line', () => {
    const e = fails('kind: Pod\nmetadata:\n  name: a\n  labels: {x: 1\n');
    expect(e.file).toBe('/etc/pods.yaml');
    expect(e.line).toBeGreaterThanOrEqual(4);
    expect(e.message).toMatch(/^\/etc\/pods\.yaml:\d+:\d+: /);
  });

  it('reports JSON syntax errors with the line', () => {
    // (a trailing comma is valid YAML flow syntax, so use a missing comma)
    const e = fails('{"kind": "Pod",\n "metadata": {"name": "a" "ns": "b"}\n}\n');
    expect(e.line).toBe(2);
  });

  it('rejects duplicate keys, a pod without a name, and non-objects, naming the line', () => {
    expect(fails('kind: Pod\nmetadata:\n  name: a\n  name: b\n').line).toBe(4);
    const noName = fails('kind: Pod\nmetadata: {name: a}\n---\nkind: Pod\nmetadata:\n  namespace: q\n');
    expect(noName.line).toBe(4);
    expect(noName.detail).toBe('Pod has no metadata.name');
    expect(fails('kind: List\nitems:\n- metadata: {name: a}\n- 42\n').line).toBe(4);
    expect(fails('- just\n- a list\n').detail).toMatch(/expected a Kubernetes object/);
  });

  it('rejects a pod whose fields have the wrong type, naming the pod, the field and the line', () => {
    const e = fails('kind: Pod\nmetadata:\n  name: a\n---\nkind: Pod\nmetadata:\n  name: web\n  annotations:\n    traffic.sidecar.istio.io/excludeOutboundPorts: 5555\nspec:\n  containers: [{name: app}]\n');
    expect(e.line).toBe(5);
    expect(e.message).toMatch(/Pod web: metadata\.annotations\["traffic\.sidecar\.istio\.io\/excludeOutboundPorts"\] must be a string, got the number 5555/);
    expect(fails('kind: Pod\nmetadata: {name: web}\nspec:\n  containers: [null]\n').message).toMatch(/spec\.containers\[0\] must be a mapping/);
  });

  it('accepts an empty file as no pods', () => {
    expect(parsePodManifests('', 'f').pods).toEqual([]);
    expect(parsePodManifests('# nothing yet\n', 'f').pods).toEqual([]);
  });
});
