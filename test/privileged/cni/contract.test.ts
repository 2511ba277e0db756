// The CNI contract from a container runtime's point of view: exec the real
// build/bin/meshcap-cni with CNI env + stdin against the real startCniServer,
// and check stdout JSON + exit code. Needs no root, but execs a built binary
// and binds unix sockets, so it lives with the integration tests.
// Build the binary first: cmake -S native/cni -B build/cni-only -DMESHCAP_BIN_DIR=$PWD/build/bin && cmake --build build/cni-only
import { execa } from 'execa';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import net from 'node:net';
import { Writable } from 'node:stream';
import pino from 'pino';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startCniServer, type CniServer } from '../../../src/cni/server.js';
import { CniError } from '../../../src/cni/errors.js';
import { SUPPORTED_VERSIONS, type CniVersion } from '../../../src/cni/rules.js';
import type { CniHandlers, CniRequest } from '../../../src/cni/types.js';
import { scaled } from '../../helpers/lab.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const BIN = path.join(root, 'build/bin/meshcap-cni');

let dir: string | undefined; // made by serve(), removed after each test
let sock: string;
let server: CniServer | undefined;
const logLines: Record<string, unknown>[] = [];
const logger = pino(
  { level: 'debug' },
  new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split('\n')) if (l) logLines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  }),
);

type Call = { verb: string; req: CniRequest; attachments?: { containerId: string; ifname: string }[] };
let calls: Call[] = [];
let behaviour: (verb: string, req: CniRequest) => Promise<void> = async () => {};

const handlers: CniHandlers = {
  add: (req) => (calls.push({ verb: 'ADD', req }), behaviour('ADD', req)),
  del: (req) => (calls.push({ verb: 'DEL', req }), behaviour('DEL', req)),
  check: (req) => (calls.push({ verb: 'CHECK', req }), behaviour('CHECK', req)),
  status: (req) => (calls.push({ verb: 'STATUS', req }), behaviour('STATUS', req)),
  gc: (req, attachments) => (calls.push({ verb: 'GC', req, attachments }), behaviour('GC', req)),
};

beforeAll(() => {
  if (!existsSync(BIN)) {
    throw new Error(`${BIN} is missing: build it with \`npx cmake-js compile -d native -O build/native\` or \`cmake -S native/cni -B build/cni-only -DMESHCAP_BIN_DIR=$PWD/build/bin && cmake --build build/cni-only\``);
  }
});

async function serve(): Promise<void> {
  dir = mkdtempSync(path.join(tmpdir(), 'meshcap-cni-'));
  sock = path.join(dir, 'run', 'cni.sock');
  server = await startCniServer({ socketPath: sock, handlers, logger });
}

afterEach(async () => {
  await server?.close();
  server = undefined;
  calls = [];
  logLines.length = 0;
  behaviour = async () => {};
  if (dir) rmSync(dir, { recursive: true, force: true });
  dir = undefined;
});

interface Run {
  exitCode: number;
  stdout: string;
  json: Record<string, unknown> | undefined;
  ms: number;
}

const POD_ARGS = 'IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-1;K8S_POD_INFRA_CONTAINER_ID=c0ffee01;K8S_POD_UID=0b6c';

function envFor(command: string, over: Record<string, string | undefined> = {}): Record<string, string> {
  const base: Record<string, string | undefined> = {
    CNI_COMMAND: command,
    CNI_CONTAINERID: 'c0ffee01',
    CNI_NETNS: '/var/run/netns/meshcap-test-does-not-exist',
    CNI_IFNAME: 'eth0',
    CNI_ARGS: POD_ARGS,
    CNI_PATH: '/opt/cni/bin',
    ...over,
  };
  const out: Record<string, string> = { PATH: process.env.PATH ?? '/usr/bin:/bin' };
  for (const [k, v] of Object.entries(base)) if (v !== undefined) out[k] = v;
  return out;
}

async function runPlugin(command: string, stdin: string | Buffer, env: Record<string, string | undefined> = {}): Promise<Run> {
  const t0 = performance.now();
  const r = await execa(BIN, [], { env: envFor(command, env), extendEnv: false, input: stdin, reject: false, timeout: 30_000 });
  const ms = performance.now() - t0;
  expect(r.timedOut, 'the plugin must never hang').toBe(false);
  expect(r.signal, `the plugin must not crash (stderr: ${r.stderr})`).toBeUndefined();
  const stdout = String(r.stdout);
  let json: Record<string, unknown> | undefined;
  if (stdout.trim() !== '') json = JSON.parse(stdout) as Record<string, unknown>;
  return { exitCode: r.exitCode ?? -1, stdout, json, ms };
}

function netconf(version: string, extra: Record<string, unknown> = {}): string {
  return JSON.stringify({ cniVersion: version, name: 'meshnet', type: 'meshcap-cni', agentSocket: sock, ...extra });
}

const prev040 = {
  cniVersion: '0.4.0',
  interfaces: [{ name: 'eth0', mac: '02:42:c6:12:00:05', sandbox: '/var/run/netns/p' }],
  ips: [{ version: '4', address: '198.18.0.5/24', gateway: '198.18.0.1', interface: 0 }, { version: '6', address: '2001:db8::5/64', interface: 0 }],
  routes: [{ dst: '0.0.0.0/0', gw: '198.18.0.1' }],
  dns: { nameservers: ['198.18.0.53'] },
};
const prev100 = {
  cniVersion: '1.0.0',
  interfaces: prev040.interfaces,
  ips: [{ address: '198.18.0.5/24', gateway: '198.18.0.1', interface: 0 }, { address: '2001:db8::5/64', interface: 0 }],
  routes: prev040.routes,
  dns: prev040.dns,
};
const prevFor = (v: CniVersion) => (v.startsWith('0.') ? { ...prev040, cniVersion: v } : { ...prev100, cniVersion: v });

describe('VERSION (answered by the binary itself)', () => {
  it('lists the supported versions without an agent', async () => {
    sock = '/nonexistent/meshcap.sock';
    const r = await runPlugin('VERSION', '{"cniVersion":"1.0.0"}', { CNI_CONTAINERID: undefined, CNI_NETNS: undefined, CNI_IFNAME: undefined });
    expect(r.exitCode).toBe(0);
    expect(r.json).toEqual({ cniVersion: '1.0.0', supportedVersions: ['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'] });
    const empty = await runPlugin('VERSION', '');
    expect(empty.json).toMatchObject({ cniVersion: '1.1.0' });
  });
});

describe('with the agent serving', () => {
  for (const v of SUPPORTED_VERSIONS) {
    it(`ADD ${v}: handler sees the request; stdout is prevResult in ${v} format`, async () => {
      await serve();
      const r = await runPlugin('ADD', netconf(v, { prevResult: prevFor(v), excludeNamespaces: ['kube-system'] }));
      expect(r.exitCode).toBe(0);
      expect(r.json).toEqual(prevFor(v));
      expect(calls).toHaveLength(1);
      expect(calls[0]!.req).toMatchObject({
        command: 'ADD', containerId: 'c0ffee01', netns: '/var/run/netns/meshcap-test-does-not-exist', ifname: 'eth0',
        podNamespace: 'shop', podName: 'cart-1', cniVersion: v,
      });
      expect(calls[0]!.req.args).toMatchObject({ K8S_POD_INFRA_CONTAINER_ID: 'c0ffee01', K8S_POD_UID: '0b6c' });
      expect(calls[0]!.req.config.excludeNamespaces).toEqual(['kube-system']);
      const line = logLines.find((l) => l.msg === 'cni request');
      expect(line).toMatchObject({ verb: 'ADD', podNamespace: 'shop', podName: 'cart-1', containerId: 'c0ffee01', result: 'ok' });
      expect(typeof line?.durationMs).toBe('number');
    });

    it(`ADD ${v} without prevResult answers {cniVersion}`, async () => {
      await serve();
      const r = await runPlugin('ADD', netconf(v));
      expect(r.exitCode).toBe(0);
      expect(r.json).toEqual({ cniVersion: v });
    });

    it(`DEL ${v} with and without prevResult, netns empty: exit 0, empty stdout`, async () => {
      await serve();
      const a = await runPlugin('DEL', netconf(v, { prevResult: prevFor(v) }), { CNI_NETNS: '' });
      const b = await runPlugin('DEL', netconf(v));
      expect([a.exitCode, a.stdout, b.exitCode, b.stdout]).toEqual([0, '', 0, '']);
      expect(calls.map((c) => [c.verb, c.req.netns])).toEqual([['DEL', ''], ['DEL', '/var/run/netns/meshcap-test-does-not-exist']]);
      expect(calls[0]!.req.config.prevResult).toEqual(prevFor(v));
    });
  }

  it('a netns path that does not exist is forwarded as is (the agent decides)', async () => {
    await serve();
    for (const netns of ['/proc/999999999/ns/net', '/var/run/netns/' + 'x'.repeat(200)]) {
      const r = await runPlugin('ADD', netconf('1.1.0'), { CNI_NETNS: netns });
      expect(r.exitCode).toBe(0);
      expect(calls.at(-1)?.req.netns).toBe(netns);
    }
  });

  it('ADD carries the netns cookie the forwarder read in CNI_NETNS (the agent then needs no setns); none where it is no netns, and never for DEL', async () => {
    await serve();
    const { netnsCookie: readCookie } = await import('../../../src/native/addon.js');
    // SO_NETNS_COOKIE is Linux >= 5.14: below it the forwarder sends no cookie
    // (the agent reads it itself, where its datapath needs one).
    const kernelHasCookie = await readCookie('/proc/self/ns/net').then(() => true, (e: unknown) => {
      if ((e as { code?: string }).code === 'ENOPROTOOPT') return false;
      throw e;
    });
    const netnsCookie = async (p: string) => (kernelHasCookie ? readCookie(p) : undefined);
    const ns = `meshcap-cookie-${process.pid}`;
    await execa('ip', ['netns', 'add', ns]);
    try {
      const nsPath = `/var/run/netns/${ns}`;
      for (const netns of [nsPath, '/proc/self/ns/net']) {
        const r = await runPlugin('ADD', netconf('1.1.0'), { CNI_NETNS: netns });
        expect(r.exitCode).toBe(0);
        // '/proc/self/ns/net' is the forwarder's own, i.e. this host's: the same as the test's
        expect(calls.at(-1)?.req.netnsCookie, netns).toBe(await netnsCookie(netns));
      }
      if (kernelHasCookie) expect(await netnsCookie(nsPath)).not.toBe(await netnsCookie('/proc/self/ns/net'));
      for (const netns of ['/proc/999999999/ns/net', '/etc/hostname']) {
        const r = await runPlugin('ADD', netconf('1.1.0'), { CNI_NETNS: netns });
        expect(r.exitCode).toBe(0);
        expect(calls.at(-1)?.req.netnsCookie, netns).toBeUndefined();
      }
      await runPlugin('DEL', netconf('1.1.0'), { CNI_NETNS: nsPath });
      expect(calls.at(-1)).toMatchObject({ verb: 'DEL' });
      expect(calls.at(-1)?.req.netnsCookie).toBeUndefined();
    } finally {
      await execa('ip', ['netns', 'del', ns], { reject: false });
    }
  });

  it('converts a prevResult given in another version to the config version', async () => {
    await serve();
    const to040 = await runPlugin('ADD', netconf('0.4.0', { prevResult: prev100 }));
    expect(to040.json).toEqual({ ...prev040, cniVersion: '0.4.0' });
    const to100 = await runPlugin('ADD', netconf('1.0.0', { prevResult: prev040 }));
    expect(to100.json).toEqual({ ...prev100, cniVersion: '1.0.0' });
  });

  it('CHECK needs 0.4.0+; 0.4.0..1.1.0 reach the handler', async () => {
    await serve();
    const old = await runPlugin('CHECK', netconf('0.3.1', { prevResult: prevFor('0.3.1') }));
    expect(old.exitCode).toBe(1);
    expect(old.json).toMatchObject({ code: 1, cniVersion: '0.3.1' });
    for (const v of ['0.4.0', '1.0.0', '1.1.0'] as const) {
      const r = await runPlugin('CHECK', netconf(v, { prevResult: prevFor(v) }));
      expect([r.exitCode, r.stdout]).toEqual([0, '']);
    }
    expect(calls.map((c) => c.verb)).toEqual(['CHECK', 'CHECK', 'CHECK']);
  });

  it('STATUS and GC need 1.1.0; GC passes the valid attachments', async () => {
    await serve();
    const status = await runPlugin('STATUS', netconf('1.1.0'), { CNI_CONTAINERID: undefined, CNI_NETNS: undefined, CNI_IFNAME: undefined, CNI_ARGS: undefined });
    expect([status.exitCode, status.stdout]).toEqual([0, '']);
    const gc = await runPlugin(
      'GC',
      netconf('1.1.0', { 'cni.dev/valid-attachments': [{ containerID: 'c1', ifname: 'eth0' }, { containerID: 'c2', ifname: 'eth0' }] }),
      { CNI_CONTAINERID: undefined, CNI_NETNS: undefined, CNI_IFNAME: undefined, CNI_ARGS: undefined },
    );
    expect([gc.exitCode, gc.stdout]).toEqual([0, '']);
    expect(calls.find((c) => c.verb === 'GC')?.attachments).toEqual([{ containerId: 'c1', ifname: 'eth0' }, { containerId: 'c2', ifname: 'eth0' }]);
    for (const verb of ['STATUS', 'GC']) {
      const r = await runPlugin(verb, netconf('1.0.0'));
      expect(r.json).toMatchObject({ code: 1, cniVersion: '1.0.0' });
    }
    expect(calls).toHaveLength(2);
  });

  it('a handler CniError is the plugin error, exit 1', async () => {
    await serve();
    behaviour = async (verb) => {
      if (verb === 'STATUS') throw new CniError(50, 'datapath not loaded yet');
      throw new CniError(7, 'pod shop/cart-1: bad annotation traffic.sidecar.istio.io/includeOutboundPorts', 'value "x" is not a port');
    };
    const add = await runPlugin('ADD', netconf('1.0.0', { prevResult: prev100 }));
    expect(add.exitCode).toBe(1);
    expect(add.json).toEqual({ cniVersion: '1.0.0', code: 7, msg: 'pod shop/cart-1: bad annotation traffic.sidecar.istio.io/includeOutboundPorts', details: 'value "x" is not a port' });
    const st = await runPlugin('STATUS', netconf('1.1.0'));
    expect(st.json).toMatchObject({ code: 50, msg: 'datapath not loaded yet' });
    expect(logLines.filter((l) => l.msg === 'cni request' && l.result === 'error').map((l) => l.code)).toEqual([7, 50]);
  });

  it('any other handler error becomes 999 with its message, logged with the stack', async () => {
    await serve();
    behaviour = async () => {
      throw new Error('map update failed: ENOSPC');
    };
    const r = await runPlugin('ADD', netconf('0.3.0'));
    expect(r.exitCode).toBe(1);
    expect(r.json).toEqual({ cniVersion: '0.3.0', code: 999, msg: 'map update failed: ENOSPC' });
    const line = logLines.find((l) => l.msg === 'cni request failed unexpectedly') as { err?: { stack?: string } } | undefined;
    expect(line?.err?.stack).toContain('map update failed');
  });

  it('a prevResult the server cannot convert fails ADD before the handler runs', async () => {
    await serve();
    const r = await runPlugin('ADD', netconf('1.0.0', { prevResult: { ip4: { ip: '198.18.0.5/24' } } }));
    expect(r.json).toMatchObject({ code: 7 });
    expect(calls).toHaveLength(0);
  });

  it('an agent that hangs: code 11 within agentTimeoutMs', async () => {
    await serve();
    behaviour = () => new Promise(() => {});
    const r = await runPlugin('ADD', netconf('1.0.0', { agentTimeoutMs: 500 }));
    expect(r.exitCode).toBe(1);
    expect(r.json).toMatchObject({ cniVersion: '1.0.0', code: 11 });
    expect(String(r.json?.msg)).toContain(sock);
    expect(String(r.json?.msg)).toMatch(/agentTimeoutMs 500/);
    expect(r.ms).toBeGreaterThanOrEqual(450);
    expect(r.ms).toBeLessThan(3000);
    const del = await runPlugin('DEL', netconf('1.0.0', { agentTimeoutMs: 300 }));
    expect([del.exitCode, del.stdout]).toEqual([0, '']);
  });

  it('serves concurrent requests independently', async () => {
    await serve();
    // 20 forwarders and this process's server share the CPUs: in a slow guest
    // the default 10 s agent deadline is not the point of this test.
    const conf = netconf('1.1.0', { agentTimeoutMs: scaled(10_000) });
    const runs = await Promise.all(
      Array.from({ length: 20 }, (_, i) => runPlugin('ADD', conf, { CNI_CONTAINERID: `pod${i}`, CNI_ARGS: `K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p${i}` })),
    );
    const failed = runs.flatMap((r, i) => (r.exitCode === 0 ? [] : [`pod${i}: exit ${r.exitCode} after ${Math.round(r.ms)} ms: ${r.stdout}`]));
    expect(failed, 'every concurrent ADD succeeds').toEqual([]);
    expect(new Set(calls.map((c) => c.req.podName)).size).toBe(20);
  });
});

describe('bad input: CNI errors, never a crash or a hang', () => {
  it('invalid JSON -> 6', async () => {
    await serve();
    const r = await runPlugin('ADD', '{"cniVersion": "1.0.0",');
    expect(r.exitCode).toBe(1);
    expect(r.json).toMatchObject({ code: 6 });
    expect(calls).toHaveLength(0);
  });

  it('missing env vars -> 4 naming them', async () => {
    await serve();
    const r = await runPlugin('ADD', netconf('1.0.0'), { CNI_NETNS: undefined, CNI_IFNAME: undefined });
    expect(r.json).toMatchObject({ code: 4 });
    expect(String(r.json?.msg)).toMatch(/CNI_NETNS, CNI_IFNAME are not set/);
    const unknownCmd = await runPlugin('', netconf('1.0.0'), { CNI_COMMAND: 'add' });
    expect(unknownCmd.json).toMatchObject({ code: 4 });
    const unknown = await runPlugin('FROB', netconf('1.0.0'));
    expect(unknown.json).toMatchObject({ code: 4 });
    expect(calls).toHaveLength(0);
  });

  it('no CNI_COMMAND (run by hand): the about text with version and CNI versions on stderr, exit 0, as the reference plugins', async () => {
    for (const over of [{ CNI_COMMAND: undefined }, { CNI_COMMAND: '' }]) {
      const r = await execa(BIN, [], { env: envFor('ADD', over), extendEnv: false, input: '', reject: false });
      expect(r.exitCode).toBe(0);
      expect(r.stdout).toBe('');
      const pkg = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')) as { version: string };
      expect(r.stderr.startsWith(`meshcap-cni v${pkg.version} (commit `), r.stderr).toBe(true);
      expect(r.stderr).toMatch(/\(commit ([0-9a-f]{12}(-dirty)?|unknown)\)/);
      expect(r.stderr).toMatch(/\nCNI protocol versions supported: 0\.3\.0, 0\.3\.1, 0\.4\.0, 1\.0\.0, 1\.1\.0$/);
    }
    expect(calls).toHaveLength(0);
  });

  it('unknown cniVersion -> 1', async () => {
    await serve();
    for (const v of ['0.2.0', '2.0.0']) {
      const r = await runPlugin('ADD', netconf(v));
      expect(r.exitCode).toBe(1);
      expect(r.json).toMatchObject({ code: 1, cniVersion: v });
    }
    const missing = await runPlugin('ADD', JSON.stringify({ name: 'n', type: 'meshcap-cni', agentSocket: sock }));
    expect(missing.json).toMatchObject({ code: 1, cniVersion: '1.1.0' });
  });

  it('invalid config the agent validates -> 7 from the agent; invalid env format -> 4', async () => {
    await serve();
    const r = await runPlugin('ADD', netconf('1.0.0', { name: '../etc' }));
    expect(r.json).toMatchObject({ code: 7 });
    const badId = await runPlugin('ADD', netconf('1.0.0'), { CNI_CONTAINERID: 'a/b' });
    expect(badId.json).toMatchObject({ code: 4 });
    const badTimeout = await runPlugin('ADD', netconf('1.0.0', { agentTimeoutMs: -1 }));
    expect(badTimeout.json).toMatchObject({ code: 7 });
    expect(calls).toHaveLength(0);
  });

  it('10 MB stdin is refused quickly', async () => {
    await serve();
    const big = Buffer.alloc(10 * 1024 * 1024, 0x20);
    const r = await runPlugin('ADD', big);
    expect(r.exitCode).toBe(1);
    expect(r.json).toMatchObject({ code: 7 });
    expect(String(r.json?.msg)).toContain('1048576');
    expect(r.ms).toBeLessThan(2000);
    expect(calls).toHaveLength(0);
  });
});

describe('misbehaving agent', () => {
  let rawDir: string;
  let rawServer: net.Server | undefined;
  beforeEach(() => {
    rawDir = mkdtempSync(path.join(tmpdir(), 'meshcap-cni-raw-'));
    sock = path.join(rawDir, 'cni.sock');
  });
  afterEach(async () => {
    await new Promise<void>((res) => (rawServer ? rawServer.close(() => res()) : res()));
    rawServer = undefined;
    rmSync(rawDir, { recursive: true, force: true });
  });
  /** A raw agent that reads the request and then does `act` with the socket. */
  async function rawAgent(act: (s: net.Socket) => void): Promise<void> {
    rawServer = net.createServer({ allowHalfOpen: true }, (s) => {
      s.on('error', () => {});
      s.resume();
      s.on('end', () => act(s));
    });
    await new Promise<void>((res) => rawServer!.listen(sock, res));
  }

  it('closing without an answer counts as unreachable: ADD 11, DEL ok', async () => {
    await rawAgent((s) => s.end());
    const add = await runPlugin('ADD', netconf('1.0.0'));
    expect(add.json).toMatchObject({ code: 11 });
    expect(String(add.json?.msg)).toMatch(/closed the connection without answering/);
    const del = await runPlugin('DEL', netconf('1.0.0'));
    expect([del.exitCode, del.stdout]).toEqual([0, '']);
  });

  it('a malformed reply is 999 naming the socket', async () => {
    await rawAgent((s) => s.end('{"exitCode":"zero"}'));
    const r = await runPlugin('ADD', netconf('1.0.0'));
    expect(r.exitCode).toBe(1);
    expect(r.json).toMatchObject({ code: 999, cniVersion: '1.0.0' });
    expect(String(r.json?.msg)).toContain(sock);
  });

  it('a reply over 4 MiB is refused (999), not buffered without bound', async () => {
    await rawAgent((s) => s.end(Buffer.alloc(6 << 20, 0x20)));
    const r = await runPlugin('ADD', netconf('1.0.0'));
    expect(r.json).toMatchObject({ code: 999 });
    expect(String(r.json?.msg)).toMatch(/exceeds/);
  });

  it('a failure with empty stdout becomes a CNI error (999) with the agent\'s exit code named, not an empty answer', async () => {
    await rawAgent((s) => s.end(JSON.stringify({ exitCode: 3, stdout: '' })));
    const r = await runPlugin('ADD', netconf('1.0.0'));
    expect(r.exitCode).toBe(1);
    expect(r.json).toMatchObject({ cniVersion: '1.0.0', code: 999 });
    expect(String(r.json?.msg)).toBe(`meshcap agent at ${sock} failed with exit code 3 and no error message`);
  });

  it('a failure whose stdout is not CNI error JSON becomes a CNI error quoting it', async () => {
    await rawAgent((s) => s.end(JSON.stringify({ exitCode: 1, stdout: 'TypeError: x is undefined' })));
    const r = await runPlugin('DEL', netconf('1.0.0'));
    expect(r.exitCode).toBe(1);
    expect(r.json).toMatchObject({ code: 999, details: 'agent output: TypeError: x is undefined' });
    expect(String(r.json?.msg)).toMatch(/an error that is not CNI error JSON/);
  });

  it('ADD success with non-JSON stdout becomes a CNI error, not a result the runtime cannot parse', async () => {
    for (const stdout of ['ok', '', '[1]']) {
      await new Promise<void>((res) => (rawServer ? rawServer.close(() => res()) : res()));
      await rawAgent((s) => s.end(JSON.stringify({ exitCode: 0, stdout })));
      const r = await runPlugin('ADD', netconf('1.0.0'));
      expect(r.exitCode, stdout).toBe(1);
      expect(r.json, stdout).toMatchObject({ code: 999 });
      expect(String(r.json?.msg), stdout).toMatch(/answered ADD with (output|nothing) instead of a JSON result/);
    }
  });

  it('relays the agent exit code and stdout verbatim', async () => {
    await rawAgent((s) => s.end(JSON.stringify({ exitCode: 1, stdout: '{"cniVersion":"1.0.0","code":3,"msg":"gone"}' })));
    const r = await runPlugin('CHECK', netconf('1.0.0'));
    expect([r.exitCode, r.stdout]).toEqual([1, '{"cniVersion":"1.0.0","code":3,"msg":"gone"}']);
  });
});

describe('stdin that never closes', () => {
  it('ends with code 5 after the 5 s stdin deadline, not a hang', async () => {
    const t0 = performance.now();
    const child = execa(BIN, [], { env: envFor('ADD'), extendEnv: false, stdin: 'pipe', reject: false, timeout: 20_000 });
    child.stdin?.write('{"cniVersion":');
    const r = await child;
    const ms = performance.now() - t0;
    expect(r.timedOut).toBe(false);
    expect(r.exitCode).toBe(1);
    expect(JSON.parse(String(r.stdout))).toMatchObject({ code: 5 });
    expect(ms).toBeGreaterThan(4500);
    expect(ms).toBeLessThan(8000);
  });
});

describe('agent absent', () => {
  let absentDir: string;
  beforeAll(() => {
    absentDir = mkdtempSync(path.join(tmpdir(), 'meshcap-cni-absent-'));
  });
  beforeEach(() => {
    sock = path.join(absentDir, 'absent.sock');
  });
  afterAll(() => rmSync(absentDir, { recursive: true, force: true }));

  it('ADD -> 11 naming the socket', async () => {
    const r = await runPlugin('ADD', netconf('1.0.0', { prevResult: prev100 }));
    expect(r.exitCode).toBe(1);
    expect(r.json).toMatchObject({ cniVersion: '1.0.0', code: 11 });
    expect(String(r.json?.msg)).toContain(sock);
  });

  it('DEL and GC succeed, CHECK -> 11, STATUS -> 50', async () => {
    const del = await runPlugin('DEL', netconf('1.0.0'));
    expect([del.exitCode, del.stdout]).toEqual([0, '']);
    const gc = await runPlugin('GC', netconf('1.1.0'));
    expect([gc.exitCode, gc.stdout]).toEqual([0, '']);
    const check = await runPlugin('CHECK', netconf('1.0.0', { prevResult: prev100 }));
    expect(check.json).toMatchObject({ code: 11 });
    const status = await runPlugin('STATUS', netconf('1.1.0'));
    expect(status.json).toMatchObject({ code: 50 });
    expect(String(status.json?.msg)).toContain(sock);
  });

  it('a socket file nobody listens on counts as absent (ECONNREFUSED)', async () => {
    const stale = path.join(absentDir, 'stale.sock');
    // A bound, never-listening unix socket: what a crashed agent leaves behind.
    await execa('python3', ['-c', `import socket; s=socket.socket(socket.AF_UNIX); s.bind(${JSON.stringify(stale)})`]);
    const r = await runPlugin('ADD', netconf('1.0.0', { agentSocket: stale }));
    expect(r.json).toMatchObject({ code: 11 });
    expect(String(r.json?.msg)).toMatch(/Connection refused/);
  });

  it('an excluded namespace gets prevResult passed through, converted to the config version', async () => {
    const args = 'K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-1';
    const ex = { excludeNamespaces: ['istio-system', 'kube-system'] };
    for (const v of SUPPORTED_VERSIONS) {
      const r = await runPlugin('ADD', netconf(v, { ...ex, prevResult: prevFor(v) }), { CNI_ARGS: args });
      expect(r.exitCode).toBe(0);
      expect(r.json).toEqual(prevFor(v));
    }
    const down = await runPlugin('ADD', netconf('0.3.1', { ...ex, prevResult: prev100 }), { CNI_ARGS: args });
    expect(down.json).toEqual({ ...prev040, cniVersion: '0.3.1' });
    const up = await runPlugin('ADD', netconf('1.1.0', { ...ex, prevResult: prev040 }), { CNI_ARGS: args });
    expect(up.json).toEqual({ ...prev100, cniVersion: '1.1.0' });
    const none = await runPlugin('ADD', netconf('1.0.0', ex), { CNI_ARGS: args });
    expect(none.json).toEqual({ cniVersion: '1.0.0' });
    const check = await runPlugin('CHECK', netconf('1.0.0', { ...ex, prevResult: prev100 }), { CNI_ARGS: args });
    expect([check.exitCode, check.stdout]).toEqual([0, '']);
    // Not excluded: still 11.
    const meshed = await runPlugin('ADD', netconf('1.0.0', { ...ex, prevResult: prev100 }), { CNI_ARGS: 'K8S_POD_NAMESPACE=shop;K8S_POD_NAME=x' });
    expect(meshed.json).toMatchObject({ code: 11 });
  });
});
