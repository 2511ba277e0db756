// Property-based: 10,000 generated wire requests (raw bytes, JSON of every
// shape, v1 requests with random fields, configs and prevResults) through the
// agent's wire decoder, request parser and dispatch. Every one is answered
// with a spec CNI error or the verb's valid result, and none throws.
// (The same traffic against a running agent's socket:
// test/faults/agent-hostile-input.test.ts.)
import fc from 'fast-check';
import { expect, it } from 'vitest';
import { dispatch } from '../../../src/cni/dispatch.js';
import { CniError } from '../../../src/cni/errors.js';
import type { CniHandlers } from '../../../src/cni/types.js';
import { decodeWireRequest } from '../../../src/cni/wire.js';
import { answerProblems, wireRequest } from '../../helpers/cni-arbitraries.js';

// Handlers that accept (the parser, not the agent's decisions, is under test
// here; test/faults runs the real agent).
const handlers: CniHandlers = { add: async () => undefined, del: async () => undefined, check: async () => undefined, status: async () => undefined, gc: async () => undefined };

it('10,000 generated requests: each decoded and answered with a spec CNI error or a valid result', async () => {
  const seen = { ok: 0, errors: new Map<number, number>() };
  await fc.assert(fc.asyncProperty(wireRequest, async (buf) => {
    let reply;
    try {
      reply = (await dispatch(decodeWireRequest(buf), handlers)).reply;
    } catch (e) {
      if (!(e instanceof CniError)) throw e; // only CniError may leave the decoder
      reply = { exitCode: 1, stdout: JSON.stringify(e.toResult(undefined)) };
    }
    expect(answerProblems(buf, reply), buf.toString('utf8').slice(0, 300)).toEqual([]);
    if (reply.exitCode === 0) seen.ok++;
    else {
      const code = (JSON.parse(reply.stdout) as { code: number }).code;
      seen.errors.set(code, (seen.errors.get(code) ?? 0) + 1);
    }
  }), { numRuns: 10_000, seed: Number(process.env.MESHCAP_FC_SEED ?? Date.now() % 2 ** 31) });
  console.log(`wire properties: ${seen.ok} answered ok, errors by code ${JSON.stringify(Object.fromEntries([...seen.errors].sort((a, b) => a[0] - b[0])))}`);
  // the generator reaches the handlers and most error paths, not just the decoder
  expect(seen.ok).toBeGreaterThan(50);
  expect([...seen.errors.keys()]).toEqual(expect.arrayContaining([1, 4, 6, 7]));
}, 120_000);
