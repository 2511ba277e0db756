// The running agent under hostile input: 10,000 generated wire requests
// (test/helpers/cni-arbitraries.ts: raw bytes, JSON of every shape, v1
// requests with random fields, configs and prevResults) sent to
// `meshcap agent`'s CNI socket, one connection each, as a forwarder would.
// Every one gets a wire reply holding a spec CNI error or the verb's valid
// result; the agent process is alive afterwards, serves a normal ADD/DEL, and
// holds no more fds than before. iptables mode: no kernel hooks are needed
// for what is under test (requests that reach a handler find a pod that is
// not meshed, an unknown pod, or a netns that does not exist).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import fc from 'fast-check';
import { stringify } from 'yaml';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { AgentProcess } from '../helpers/agent-process.js';
import { answerProblems, wireRequest } from '../helpers/cni-arbitraries.js';
import { testPinRoot } from '../helpers/lab.js';

const RUNS = process.env.MESHCAP_FAULTS_LONG === '1' ? 50_000 : 10_000;
let tmp: string;
let agent: AgentProcess;
let socket: string;

beforeAll(async () => {
  if (process.getuid?.() !== 0) throw new Error('the agent needs root (its state dir and socket are root-only)');
  tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-hostile-'));
  const pods = path.join(tmp, 'pods.yaml');
  writeFileSync(pods, stringify({ apiVersion: 'v1', kind: 'Pod', metadata: { name: 'p', namespace: 'default' }, spec: { containers: [{ name: 'app', image: 'app' }] } }));
  socket = path.join(tmp, 'run', 'cni.sock');
  agent = await AgentProcess.start({ pods, socket, pinRoot: testPinRoot(), stateDir: path.join(tmp, 'state'), mode: 'iptables', podWaitMs: 0 });
});
afterAll(async () => {
  await agent?.stop();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

function exchange(buf: Buffer): Promise<string> {
  return new Promise((resolve, reject) => {
    const c = net.connect(socket);
    const chunks: Buffer[] = [];
    c.on('data', (d) => chunks.push(d));
    c.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    c.on('error', reject);
    c.setTimeout(10_000, () => c.destroy(new Error('no answer within 10 s')));
    c.end(buf);
  });
}

it(`${RUNS.toLocaleString('en')} generated requests on the agent's socket: each answered with a spec CNI error or a valid result; the agent lives on`, async () => {
  // let the agent settle (lazy thread pool, first connections), then count
  await exchange(Buffer.from(JSON.stringify({ v: 1, command: 'VERSION', stdin: '' })));
  const before = agent.figures();
  const codes = new Map<string, number>();
  const t0 = performance.now();
  await fc.assert(fc.asyncProperty(wireRequest, async (buf) => {
    const text = await exchange(buf);
    const reply = JSON.parse(text) as { exitCode: unknown; stdout: unknown };
    expect(answerProblems(buf, reply), buf.toString('utf8').slice(0, 300)).toEqual([]);
    const key = reply.exitCode === 0 ? 'ok' : String((JSON.parse(reply.stdout as string) as { code: number }).code);
    codes.set(key, (codes.get(key) ?? 0) + 1);
  }), { numRuns: RUNS, seed: Number(process.env.MESHCAP_FC_SEED ?? Date.now() % 2 ** 31) });
  const s = (performance.now() - t0) / 1000;
  expect(agent.alive(), 'the agent process is alive').toBe(true);
  // still serving the real thing
  const add = JSON.parse(await exchange(Buffer.from(JSON.stringify({
    v: 1, command: 'ADD', containerId: 'after1', netns: '/var/run/netns/none', ifname: 'eth0', args: 'K8S_POD_NAMESPACE=default;K8S_POD_NAME=p',
    stdin: JSON.stringify({ cniVersion: '1.0.0', name: 'n', type: 'meshcap-cni', prevResult: { cniVersion: '1.0.0', ips: [{ address: '198.18.0.5/24' }] } }),
  })))) as { exitCode: number; stdout: string };
  expect(add.exitCode, add.stdout).toBe(0);
  await new Promise((r) => setTimeout(r, 300));
  const after = agent.figures();
  console.log(`hostile input: ${RUNS} requests in ${s.toFixed(1)} s, answers ${JSON.stringify(Object.fromEntries(codes))}; agent fds ${before.fds} -> ${after.fds}, threads ${before.threads} -> ${after.threads}, RSS ${before.rssKb} -> ${after.rssKb} kB`);
  expect(after.fds, JSON.stringify({ before: before.fdKinds, after: after.fdKinds })).toBeLessThanOrEqual(before.fds);
  const errors = agent.logs.filter((l) => l.level === 50 || l.level === 60);
  expect(errors.map((l) => l.msg), 'no error or fatal log lines (no handler threw something unexpected)').toEqual([]);
}, 900_000);
