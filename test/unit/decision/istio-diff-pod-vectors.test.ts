// Every disagreement the differential test against istio-cni found
// (test/privileged/istio-diff/pods.test.ts), kept as a pod with istio-cni's
// recorded decision and dry-run rules: meshcap must decide the same and
// render the same bytes. Where istio-cni's dry run took an annotation whose
// rules iptables-restore then rejects (its ADD fails), meshcap must fail it
// up front. The privileged test checks the recordings are still istio-cni's.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { meshcapPod, type Category } from '../../helpers/istio-diff/pod-diff.js';
import type { PodCase } from '../../helpers/istio-diff/pod-cases.js';

export interface PodVector {
  name: string;
  found: string;
  input: PodCase;
  istio: { category: Category; detail: string; v4: string | null; v6: string | null; iptablesRejects: boolean };
}
const file = JSON.parse(readFileSync(new URL('../../fixtures/istio-diff/pod-vectors.json', import.meta.url), 'utf8')) as { istio: string; vectors: PodVector[] };

describe(`istio-cni disagreements found by the differential test (istio.io/istio ${file.istio})`, () => {
  it('has vectors', () => expect(file.vectors.length).toBeGreaterThan(5));
  for (const v of file.vectors) {
    it(`${v.name}: ${v.found}`, () => {
      const m = meshcapPod(v.input);
      if (v.istio.iptablesRejects) {
        expect(m.category, m.detail).toBe('error');
        return;
      }
      expect(m.category, m.detail).toBe(v.istio.category);
      if (v.istio.category === 'redirect') {
        expect(m.v4).toBe(v.istio.v4 ?? '');
        expect(m.v6 ?? '').toBe(v.istio.v6 ?? '');
      }
    });
  }
});
