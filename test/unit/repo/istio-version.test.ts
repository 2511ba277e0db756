// The Istio version meshcap is checked against is set once, in
// scripts/build-peers.sh; the README, docs/istio-compat.md and the recorded
// differential vectors must name the same one.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { projectRoot } from '../../../src/paths.js';
import { istioVersion } from '../../helpers/istio-peers.js';

const read = (p: string) => readFileSync(path.join(projectRoot, p), 'utf8');

describe('the pinned Istio version', () => {
  const v = istioVersion();
  it('is an istio.io/istio module version', () => expect(v).toMatch(/^v\d+\.\d+\.\d+(-[0-9]{14}-[0-9a-f]{12})?$/));
  it.each(['README.md', 'docs/istio-compat.md'])('%s names it', (file) => expect(read(file)).toContain(v));
  it.each(['test/fixtures/istio-diff/renderer-vectors.json', 'test/fixtures/istio-diff/pod-vectors.json'])('%s was recorded with it', (file) => {
    expect((JSON.parse(read(file)) as { istio: string }).istio).toBe(v);
  });
});
