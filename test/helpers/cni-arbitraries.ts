// Generated CNI traffic for the property tests (fast-check): wire requests
// from raw bytes to almost-valid ones, and the check that an answer is one a
// runtime can read (a spec CNI error, or the verb's result in the config's
// version). Used in-process (test/unit/cni/wire-properties.test.ts) and
// against a running agent's socket (test/faults/agent-hostile-input.test.ts).
import fc from 'fast-check';
import { convertResult } from '../../src/cni/result.js';
import { SUPPORTED_VERSIONS, VERSION_PATTERN, type CniVersion } from '../../src/cni/rules.js';

const VERBS = ['ADD', 'DEL', 'CHECK', 'STATUS', 'GC', 'VERSION'];

/** Strings a runtime or an attacker might put in a field: plausible values, edge cases and noise. */
const field = fc.oneof(
  fc.constantFrom('', 'c0ffee', 'eth0', '/var/run/netns/x', 'K8S_POD_NAMESPACE=default;K8S_POD_NAME=p', '..', 'a'.repeat(300), '\u0000', '💥', 'K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=x', '=;=;', 'IgnoreUnknown=1'),
  fc.string({ maxLength: 40 }),
  fc.string({ unit: 'binary', maxLength: 40 }),
);

const ip = fc.oneof(
  fc.record({ address: fc.constantFrom('198.18.0.5/24', '2001:db8::5/64', '::ffff:198.18.0.1/128', ''), version: fc.constantFrom('4', '6', 4, null) }, { requiredKeys: [] }),
  fc.jsonValue({ maxDepth: 2 }),
);
/** prevResults: well-formed, slightly off, and anything. */
export const prevResult = fc.oneof(
  fc.record({
    cniVersion: fc.oneof(fc.constantFrom(...SUPPORTED_VERSIONS, '0.2.0', 'x'), fc.jsonValue({ maxDepth: 0 })),
    interfaces: fc.oneof(fc.array(fc.record({ name: fc.string(), mtu: fc.integer(), sandbox: fc.string() }, { requiredKeys: [] }), { maxLength: 3 }), fc.jsonValue({ maxDepth: 1 })),
    ips: fc.oneof(fc.array(ip, { maxLength: 3 }), fc.jsonValue({ maxDepth: 1 })),
    routes: fc.oneof(fc.array(fc.record({ dst: fc.oneof(fc.constant('0.0.0.0/0'), fc.jsonValue({ maxDepth: 0 })), table: fc.integer() }, { requiredKeys: [] }), { maxLength: 3 }), fc.jsonValue({ maxDepth: 1 })),
    dns: fc.oneof(fc.record({ nameservers: fc.array(fc.string(), { maxLength: 2 }) }), fc.jsonValue({ maxDepth: 1 })),
    ip4: fc.jsonValue({ maxDepth: 1 }),
  }, { requiredKeys: [] }),
  fc.jsonValue({ maxDepth: 3 }),
);

/** Mostly a plausible value, sometimes anything. */
const likely = (v: string) => fc.oneof({ weight: 4, arbitrary: fc.constant(v) }, { weight: 1, arbitrary: field });

/** Network configs: valid-looking with random parts, or any JSON, or not JSON. */
export const stdin = fc.oneof(
  { weight: 8, arbitrary: fc.record({
    cniVersion: fc.oneof({ weight: 8, arbitrary: fc.constantFrom(...SUPPORTED_VERSIONS) }, fc.constantFrom('0.2.0', '1.1', '9.9.9'), fc.jsonValue({ maxDepth: 0 })),
    name: fc.oneof(fc.constant('meshnet'), fc.string({ maxLength: 10 })),
    type: fc.oneof(fc.constant('meshcap-cni'), fc.string({ maxLength: 5 })),
    prevResult,
    agentSocket: fc.oneof(fc.constant('/run/x.sock'), fc.string({ maxLength: 120 })),
    agentTimeoutMs: fc.oneof(fc.integer(), fc.double()),
    excludeNamespaces: fc.oneof(fc.array(fc.string({ maxLength: 8 }), { maxLength: 3 }), fc.jsonValue({ maxDepth: 1 })),
    'cni.dev/valid-attachments': fc.oneof(fc.array(fc.record({ containerID: field, ifname: field }), { maxLength: 3 }), fc.jsonValue({ maxDepth: 1 })),
    capabilities: fc.jsonValue({ maxDepth: 1 }),
  }, { requiredKeys: ['cniVersion', 'name', 'type'] }).map((o) => JSON.stringify(o)) },
  fc.json({ maxDepth: 3 }),
  fc.string({ maxLength: 60 }),
);

/** One wire request as bytes: structured v1 requests mostly, other versions, field types and raw noise too. */
export const wireRequest: fc.Arbitrary<Buffer> = fc.oneof(
  { weight: 6, arbitrary: fc.record({
    v: fc.oneof({ weight: 9, arbitrary: fc.constant(1) }, fc.jsonValue({ maxDepth: 0 })),
    command: fc.oneof(fc.constantFrom(...VERBS), field),
    containerId: likely('c0ffee'), netns: likely('/var/run/netns/x'), ifname: likely('eth0'),
    args: likely('K8S_POD_NAMESPACE=default;K8S_POD_NAME=p'), path: field, stdin,
  }, { requiredKeys: ['v', 'command', 'stdin'] }).map((o) => Buffer.from(JSON.stringify(o))) },
  { weight: 1, arbitrary: fc.record({ v: fc.constant(1), command: fc.jsonValue({ maxDepth: 1 }), stdin: fc.jsonValue({ maxDepth: 1 }) }).map((o) => Buffer.from(JSON.stringify(o))) },
  { weight: 1, arbitrary: fc.json({ maxDepth: 3 }).map((s) => Buffer.from(s)) },
  { weight: 1, arbitrary: fc.uint8Array({ maxLength: 200 }).map((a) => Buffer.from(a)) },
);

/** The command and config version a request carries, as far as they can be read. */
export function requested(buf: Buffer): { command?: string; cniVersion?: unknown } {
  try {
    const m = JSON.parse(buf.toString('utf8')) as { command?: unknown; stdin?: unknown };
    const command = typeof m.command === 'string' ? m.command : undefined;
    let cniVersion: unknown;
    try {
      cniVersion = typeof m.stdin === 'string' ? (JSON.parse(m.stdin) as { cniVersion?: unknown })?.cniVersion : undefined;
    } catch { /* not JSON */ }
    return { command, cniVersion };
  } catch {
    return {};
  }
}

/**
 * What is wrong with an answer to `request` (empty: nothing): a wire reply
 * {exitCode, stdout}; exit 1 with a spec error object (cniVersion, integer
 * code, msg, optional string details, nothing else), or exit 0 with the
 * verb's output: VERSION's version info, ADD's result in the config's
 * cniVersion (a fixed point of the conversion), nothing for the other verbs.
 */
export function answerProblems(request: Buffer, reply: { exitCode?: unknown; stdout?: unknown }): string[] {
  const p: string[] = [];
  if (typeof reply.stdout !== 'string') return ['stdout is not a string'];
  let out: unknown;
  try {
    out = reply.stdout === '' ? undefined : JSON.parse(reply.stdout);
  } catch {
    return [`stdout is not JSON: ${reply.stdout.slice(0, 100)}`];
  }
  const o = out as Record<string, unknown> | undefined;
  const { command, cniVersion } = requested(request);
  if (reply.exitCode === 1) {
    if (typeof o !== 'object' || o === null || Array.isArray(o)) return ['an error that is not an object'];
    if (typeof o.cniVersion !== 'string' || !VERSION_PATTERN.test(o.cniVersion)) p.push(`error cniVersion ${String(o.cniVersion)}`);
    if (!Number.isInteger(o.code) || (o.code as number) < 1) p.push(`error code ${String(o.code)}`);
    if (typeof o.msg !== 'string' || o.msg === '') p.push('error msg');
    if (o.details !== undefined && typeof o.details !== 'string') p.push('error details');
    const extra = Object.keys(o).filter((k) => !['cniVersion', 'code', 'msg', 'details'].includes(k));
    if (extra.length) p.push(`error keys ${extra.join(',')}`);
    return p;
  }
  if (reply.exitCode !== 0) return [`exit code ${String(reply.exitCode)}`];
  if (command === 'VERSION') {
    if (!o || !Array.isArray(o.supportedVersions) || typeof o.cniVersion !== 'string') p.push('VERSION answer');
  } else if (command === 'ADD') {
    if (!o || o.cniVersion !== cniVersion) return [`ADD result cniVersion ${String(o?.cniVersion)} for a ${String(cniVersion)} config`];
    try {
      if (JSON.stringify(convertResult(o, cniVersion as CniVersion)) !== JSON.stringify(o)) p.push('ADD result not in its version\'s shape');
    } catch (e) {
      p.push(`ADD result is not a result: ${(e as Error).message}`);
    }
  } else if (reply.stdout !== '') {
    p.push(`${String(command)} success with output`);
  }
  return p;
}
