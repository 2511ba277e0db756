// Every disagreement the differential test against the real istio-iptables
// found (test/privileged/istio-diff/renderer.test.ts), kept as a vector with
// istio-iptables' recorded dry-run output: meshcap's render must give the
// same bytes, or reject where Istio exits non-zero. The privileged test
// checks that the recorded outputs are still what the pinned Istio prints.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { meshcapRender } from '../../helpers/istio-diff/renderer-diff.js';
import type { FlagCase } from '../../helpers/istio-diff/flag-cases.js';

export interface RendererVector {
  name: string;
  found: string;
  input: FlagCase;
  istio: { status: number; v4: string | null; v6: string | null };
}
const file = JSON.parse(readFileSync(new URL('../../fixtures/istio-diff/renderer-vectors.json', import.meta.url), 'utf8')) as { istio: string; vectors: RendererVector[] };

describe(`istio-iptables disagreements found by the differential test (istio.io/istio ${file.istio})`, () => {
  it('has vectors', () => expect(file.vectors.length).toBeGreaterThan(10));
  for (const v of file.vectors) {
    it(`${v.name}: ${v.found}`, () => {
      const m = meshcapRender(v.input);
      if (v.istio.status !== 0) {
        expect(m.ok, 'istio-iptables exits non-zero: meshcap must reject').toBe(false);
        return;
      }
      if (!m.ok) throw new Error(`meshcap rejects what istio-iptables renders: ${m.error}`);
      expect(m.v4).toBe(v.istio.v4 ?? '');
      expect(m.v6 ?? '').toBe(v.istio.v6 ?? '');
    });
  }
});
