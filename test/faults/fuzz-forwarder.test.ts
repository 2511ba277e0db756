// The C forwarder's parsing under libFuzzer with ASan/UBSan/LeakSanitizer
// (scripts/fuzz-cni.mjs, harnesses in native/cni/fuzz/): a fixed budget per
// harness, every harness must run and find no crash, leak or broken
// invariant. CI: 20 s per harness (60 s in all); npm run test:faults: 120 s
// each. The >= 10 million execution run is documented in docs/reliability.md.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { afterAll, expect, it } from 'vitest';
import { projectRoot } from '../../src/paths.js';

const SECONDS = process.env.MESHCAP_FAULTS_LONG === '1' ? 120 : 20;
const out = mkdtempSync(path.join(os.tmpdir(), 'meshcap-fuzz-'));
afterAll(() => rmSync(out, { recursive: true, force: true }));

interface HarnessResult { harness: string; execs: number; seconds: number; coverage: number | null; ok: boolean; artifacts: string[] }

it(`libFuzzer: netconf, env and agent-reply parsing, ${SECONDS} s each, no crash, leak or invariant broken`, async () => {
  const r = await execa('node', [path.join(projectRoot, 'scripts/fuzz-cni.mjs'), '--seconds', String(SECONDS), '--out', out], { reject: false, all: true });
  const last = r.all.trim().split('\n').at(-1) ?? '';
  let summary: { fuzz: HarnessResult[]; totalExecs: number; ok: boolean } | undefined;
  try {
    summary = JSON.parse(last) as typeof summary;
  } catch {
    throw new Error(`fuzz-cni.mjs did not finish (exit ${r.exitCode}):\n${r.all.slice(-4000)}`);
  }
  console.log(r.all.split('\n').filter((l) => /^(ok|FAIL) /.test(l)).join('\n'));
  console.log(`fuzz: ${summary!.totalExecs.toLocaleString('en')} executions in all`);
  expect(summary!.fuzz.map((h) => h.harness)).toEqual(['fuzz_netconf', 'fuzz_env', 'fuzz_reply']);
  expect(summary!.fuzz.filter((h) => !h.ok), r.all.slice(-4000)).toEqual([]);
  // each harness really ran (thousands of executions per second even on a busy machine)
  for (const h of summary!.fuzz) expect(h.execs, h.harness).toBeGreaterThan(SECONDS * 500);
  expect(r.exitCode).toBe(0);
}, 900_000);
