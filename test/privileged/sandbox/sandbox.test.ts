// `meshcap sandbox` end to end on this machine, with the real runtime:
// podman starts containers on the chained CNI network (bridge + host-local +
// meshcap-cni), ADD and DEL reach the standalone agent, each meshed
// container's outbound connections reach its sidecar with their original
// destination, in eBPF and iptables mode; and everything is gone afterwards,
// also after Ctrl-C and after the sandbox was killed outright.
import { execa, type ResultPromise } from 'execa';
import { existsSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { projectRoot } from '../../../src/paths.js';
import { expectedMode, requestedModes } from '../../helpers/datapaths.js';
import { scaled } from '../../helpers/lab.js';
import { PIN_PREFIX, SANDBOX_RUN_ROOT } from '../../../src/sandbox/plan.js';
import { probePodman } from '../../../src/sandbox/podman.js';
import { recoverStaleRuns } from '../../../src/sandbox/runs.js';
import { runSandbox, type PhaseReport, type SandboxReport } from '../../../src/sandbox/sandbox.js';

const MESHCAP = path.join(projectRoot, 'bin', 'meshcap');

/** Everything a run with this id could leave on the host. */
async function hostTraces(id: string, subnetPrefix: string): Promise<string[]> {
  const t: string[] = [];
  if ((await execa('ip', ['link', 'show', 'dev', `mcsb${id}`], { reject: false })).exitCode === 0) t.push(`bridge mcsb${id}`);
  const ns = (await execa('ip', ['netns', 'list'])).stdout.split('\n').filter((l) => l.startsWith(`mcsb-${id}-`));
  t.push(...ns.map((n) => `netns ${n}`));
  const bpfDir = path.dirname(PIN_PREFIX);
  t.push(...readdirSync(bpfDir).filter((e) => path.join(bpfDir, e).startsWith(`${PIN_PREFIX}${id}`)).map((e) => `pin dir ${e}`));
  if (existsSync(path.join(SANDBOX_RUN_ROOT, id))) t.push(`run dir ${id}`);
  // Host rules: the sandbox's network makes none (no gateway, no masquerade, no portmap).
  for (const save of ['iptables-save', 'ip6tables-save']) {
    const lines = (await execa(save)).stdout.split('\n').filter((l) => l.includes(`mcsb${id}`) || l.includes(subnetPrefix) || l.includes(`meshcap-sandbox-${id}`));
    t.push(...lines.map((l) => `${save}: ${l}`));
  }
  const procs = (await execa('ps', ['-eo', 'pid=,args='])).stdout.split('\n').filter((l) => l.includes(`${SANDBOX_RUN_ROOT}/${id}/`));
  t.push(...procs.map((p) => `process ${p.trim()}`));
  if (existsSync('/var/lib/cni/results')) t.push(...readdirSync('/var/lib/cni/results').filter((f) => f.startsWith(`meshcap-sandbox-${id}-`)).map((f) => `CNI cache ${f}`));
  return t;
}

const subnetPrefix = (r: SandboxReport) => r.subnet.replace(/0\/24$/, '');

// The kernel matrix (test/kernels) forces one mode with MESHCAP_MODE and says
// where eBPF mode must be refused with MESHCAP_EXPECT_MODE; the host runs both.
const MODES = requestedModes();

function expectPhases(r: SandboxReport, runtime: 'podman' | 'netns', connections: number) {
  expect(r.phases.map((p) => p.mode)).toEqual(MODES);
  for (const p of r.phases) {
    if (p.mode === 'ebpf' && expectedMode() === 'iptables') {
      // The sandbox says why and goes on with iptables mode.
      expect(p.status).toBe('skipped');
      expect(p.reason).toMatch(/eBPF mode refused on this node/);
    } else {
      expectPhase(p, p.mode, runtime, connections);
    }
  }
}

function expectPhase(p: PhaseReport, mode: string, runtime: 'podman' | 'netns', connections: number) {
  expect(p.mode).toBe(mode);
  expect(p.checks.filter((c) => !c.ok)).toEqual([]);
  expect(p.status).toBe('passed');
  const server = p.pods.find((x) => x.role === 'server')!;
  const want = { [`${server.ip}:8080`]: connections / 2, [`${server.ip}:9090`]: connections / 2 };
  for (const pod of p.pods.filter((x) => x.role === 'meshed')) {
    // The proxy's SO_ORIGINAL_DST answers are exactly what the app dialed.
    expect(pod.dialed, pod.name).toEqual(want);
    expect(pod.proxySaw, pod.name).toEqual(want);
    expect(pod.mode, pod.name).toBe(mode);
    expect(pod.captured, pod.name).toBeGreaterThanOrEqual(connections);
  }
  const unmeshed = p.pods.find((x) => x.role === 'unmeshed')!;
  expect(unmeshed.ok).toBe(connections);
  expect(unmeshed.proxySaw).toEqual({});
  expect(unmeshed.mode).toBeNull();
  expect(Object.values(server.served).reduce((a, b) => a + b, 0)).toBe(connections * (p.pods.length - 1));
  // ADD and DEL of every pod reached the agent through meshcap-cni, with the pod found by K8S_POD_NAME.
  for (const pod of p.pods) {
    for (const verb of ['ADD', 'DEL']) {
      const ev = p.cni.filter((e) => e.pod === pod.name && e.verb === verb);
      expect(ev.map((e) => e.result), `${verb} ${pod.name}`).toEqual(['ok']);
    }
  }
  // podman's container ids are 64 hex digits; the netns runtime names its own.
  const ids = p.cni.map((e) => e.containerId);
  if (runtime === 'podman') for (const id of ids) expect(id).toMatch(/^[0-9a-f]{64}$/);
  else for (const id of ids) expect(id).toMatch(/^meshcap-sandbox-[0-9a-f]{6}-/);
}

/** A `meshcap sandbox` process, its output, and the run id from its first line. */
function startCli(args: string[]) {
  const p = execa(process.execPath, [MESHCAP, 'sandbox', ...args], { reject: false, all: true, buffer: true });
  let out = '';
  p.all!.on('data', (d: Buffer) => (out += d.toString()));
  const until = async (re: RegExp, ms: number) => {
    const end = Date.now() + ms;
    while (!re.test(out)) {
      if (Date.now() > end) throw new Error(`no ${re} in the sandbox output after ${ms} ms:\n${out}`);
      if (p.exitCode !== undefined && p.exitCode !== null) throw new Error(`sandbox exited ${p.exitCode}:\n${out}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  };
  return { p, out: () => out, until, id: () => /meshcap sandbox ([0-9a-f]{6}):/.exec(out)?.[1] };
}

describe('meshcap sandbox', () => {
  const started: ResultPromise[] = [];
  afterAll(async () => {
    for (const p of started) p.kill('SIGKILL');
    await recoverStaleRuns();
  });

  it('podman is installed with its CNI backend (npm run setup installs it)', async () => {
    const p = await probePodman();
    expect(p, 'podman must be usable here: the end-to-end test below needs a real runtime').not.toHaveProperty('missing');
  });

  it('podman: containers on the chained network, ADD/DEL reach meshcap, outbound connections reach the sidecar with their original destination (eBPF, then iptables)', async () => {
    let log = '';
    const r = await runSandbox({ runtime: 'podman', modes: MODES, startupTimeoutMs: scaled(60_000), connections: 20, intervalMs: 20, out: { write: (s: string) => (log += s) } });
    expect(r.error, log).toBeUndefined();
    expect(r.runtime.kind).toBe('podman');
    expectPhases(r, 'podman', 20);
    expect(r.cleanup.filter((s) => s.error)).toEqual([]);
    expect(r.leftovers).toEqual([]);
    expect(await hostTraces(r.id, subnetPrefix(r))).toEqual([]);
    expect(r.ok, r.verdict).toBe(true);
    expect(log).toMatch(/VERDICT: meshcap works here: .* mode on podman containers/);
  }, scaled(240_000));

  it('without podman: the same CNI chain on plain network namespaces, and it says so', async () => {
    let log = '';
    const r = await runSandbox({ runtime: 'netns', modes: MODES, startupTimeoutMs: scaled(60_000), connections: 10, intervalMs: 10, meshed: 2, out: { write: (s: string) => (log += s) } });
    expect(r.error, log).toBeUndefined();
    expect(r.runtime.kind).toBe('netns');
    expect(log).toMatch(/runtime: plain network namespaces, the CNI chain run by the sandbox itself/);
    expectPhases(r, 'netns', 10);
    expect(r.leftovers).toEqual([]);
    expect(await hostTraces(r.id, subnetPrefix(r))).toEqual([]);
    expect(r.ok, r.verdict).toBe(true);
  }, scaled(180_000));

  it('Ctrl-C during traffic: exit 130 and nothing left behind', async () => {
    const c = startCli(['--runtime', 'podman', '--modes', MODES.join(','), '--startup-timeout-ms', String(scaled(60_000)), '--connections', '400', '--interval-ms', '50']);
    started.push(c.p);
    await c.until(/traffic: /, scaled(90_000));
    const id = c.id()!;
    const subnet = /on bridge mcsb[0-9a-f]{6}, (198\.19\.\d+\.)0\/24/.exec(c.out())![1]!;
    expect(await hostTraces(id, subnet), 'the run is up').toContain(`bridge mcsb${id}`);
    c.p.kill('SIGINT');
    const r = await c.p;
    expect(r.exitCode, c.out()).toBe(130);
    expect(c.out()).toMatch(/interrupted \(interrupted by SIGINT\): cleaning up/);
    expect(c.out()).toMatch(/nothing left behind/);
    expect(await hostTraces(id, subnet)).toEqual([]);
  }, scaled(180_000));

  it('killed outright (SIGKILL): the next run removes what it left', async () => {
    const c = startCli(['--runtime', 'podman', '--modes', MODES.join(','), '--startup-timeout-ms', String(scaled(60_000)), '--connections', '400', '--interval-ms', '50']);
    started.push(c.p);
    await c.until(/traffic: /, scaled(90_000));
    const id = c.id()!;
    const subnet = /on bridge mcsb[0-9a-f]{6}, (198\.19\.\d+\.)0\/24/.exec(c.out())![1]!;
    c.p.kill('SIGKILL');
    await c.p;
    const left = await hostTraces(id, subnet);
    expect(left).toContain(`bridge mcsb${id}`);
    if (MODES[0] === 'ebpf' && expectedMode() === 'ebpf') expect(left).toContain(`pin dir meshcap-sandbox-${id}-ebpf`);
    const done = await recoverStaleRuns();
    expect(done.find((l) => l.includes(`run ${id}`)), done.join('\n')).toMatch(/left behind$/);
    expect(await hostTraces(id, subnet)).toEqual([]);
  }, scaled(180_000));
});
