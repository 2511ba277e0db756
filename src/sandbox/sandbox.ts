// `meshcap sandbox`: a small node on this machine. A chained CNI network
// (bridge + host-local + meshcap-cni), the meshcap agent standalone, a
// server, meshed pods with the reference proxy as their istio-proxy sidecar
// (uid 1337), one unmeshed pod; traffic through all of it, shown live, in
// eBPF mode and then in iptables mode; a verdict; everything removed.
import { existsSync, mkdirSync, readdirSync, rmdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { collectStatus } from '../agent/status.js';
import type { Mode } from '../loader/mode.js';
import { ISTIO_PROXY_CONTAINER } from '../mesh/vocabulary.js';
import { cniBinary, projectRoot } from '../paths.js';
import { startSandboxAgent, type CniEvent, type SandboxAgent } from './agent-proc.js';
import { abortable, Cleanup, SignalAbort, sleep, type CleanupStep } from './cleanup.js';
import { NetnsRuntime, netnsName } from './netns.js';
import { listNetns } from '../lab/netns.js';
import { clientPods, makePlan, PIN_PREFIX, podsYaml, SANDBOX_RUN_ROOT, type PlanOptions, type SandboxPlan } from './plan.js';
import { PodmanRuntime, probePodman } from './podman.js';
import type { Proc } from '../lab/process.js';
import { removeRunDir, recoverStaleRuns, writeRunRecord } from './runs.js';
import { linkExists, type PodHandle, type Runtime } from './runtime.js';
import { Screen, type Out } from './screen.js';
import { renderChecks, renderTable, TABLE_LEGEND } from './table.js';
import { checkPhase, newView, onProxyLine, onWorkloadLine, percentile, type Check, type PodView } from './traffic.js';

export type RuntimeChoice = 'auto' | 'podman' | 'netns';

export interface SandboxOptions extends PlanOptions {
  runtime?: RuntimeChoice;
  modes?: Mode[];
  out?: Out;
  /** redraw the table in place (default: when out is a terminal) */
  live?: boolean;
  signal?: AbortSignal;
  /** print every check, not just the failed ones */
  verbose?: boolean;
}

export interface PhaseReport {
  mode: Mode;
  status: 'passed' | 'failed' | 'skipped';
  reason?: string;
  pods: PodSummary[];
  checks: Check[];
  cni: CniEvent[];
  durationMs: number;
}

export interface PodSummary {
  name: string;
  role: string;
  ip: string;
  mode: string | null;
  planned: number;
  ok: number;
  failed: number;
  captured: number | null;
  proxySaw: Record<string, number>;
  dialed: Record<string, number>;
  served: Record<string, number>;
  p50Ms: number | null;
  p99Ms: number | null;
  cniAdd: string;
  cniDel: string;
}

export interface SandboxReport {
  id: string;
  runtime: { kind: 'podman' | 'netns'; description: string };
  subnet: string;
  phases: PhaseReport[];
  cleanup: CleanupStep[];
  leftovers: string[];
  interrupted?: string;
  error?: string;
  ok: boolean;
  verdict: string;
  durationMs: number;
}

const WORKLOAD = path.join(projectRoot, 'dist', 'sandbox', 'workload.js');
const MESHCAP = path.join(projectRoot, 'bin', 'meshcap');

function preflight(): void {
  if (process.getuid?.() !== 0) throw new Error('meshcap sandbox needs root: it creates network namespaces, a bridge, BPF pins and iptables rules (inside the pods)');
  if (!existsSync(cniBinary)) throw new Error(`${cniBinary} is missing: run 'npm run setup' (it builds the CNI forwarder)`);
  if (!existsSync(WORKLOAD)) throw new Error(`${WORKLOAD} is missing: run 'npm run setup' (it compiles the TypeScript)`);
}

async function chooseRuntime(choice: RuntimeChoice, plan: SandboxPlan, cleanup: Cleanup): Promise<{ rt: Runtime; note?: string }> {
  if (choice === 'netns') return { rt: new NetnsRuntime(plan, cleanup, '--runtime netns') };
  const p = await probePodman();
  if ('missing' in p) {
    if (choice === 'podman') throw new Error(`--runtime podman: ${p.missing}`);
    return {
      rt: new NetnsRuntime(plan, cleanup, `no usable podman: ${p.missing}`),
      note: `podman cannot be used here (${p.missing}): driving the same CNI chain (bridge + host-local + meshcap-cni) on plain network namespaces instead`,
    };
  }
  return { rt: new PodmanRuntime(plan, cleanup, p) };
}

function summary(v: PodView): PodSummary {
  return {
    name: v.name, role: v.role, ip: v.ip, mode: v.mode, planned: v.planned, ok: v.ok, failed: v.failed, captured: v.captured,
    proxySaw: Object.fromEntries(v.proxySaw), dialed: Object.fromEntries(v.dialed), served: Object.fromEntries(v.served),
    p50Ms: percentile(v.latencies, 50), p99Ms: percentile(v.latencies, 99), cniAdd: v.cniAdd, cniDel: v.cniDel,
  };
}

interface DatapathView {
  records: number;
  orphans: number;
  problems: string[];
  byPod: Map<string, { mode: string; captured: number | null }>;
}

/** The agent's view: mode and redirected-connection counters per pod (records + pinned maps / iptables counters). */
async function readDatapath(agent: SandboxAgent): Promise<DatapathView> {
  const st = await collectStatus({ stateDir: agent.stateDir, pinRoot: agent.pinRoot });
  const byPod = new Map<string, { mode: string; captured: number | null }>();
  for (const p of st.pods) if (p.name) byPod.set(p.name, { mode: p.mode, captured: p.connections ? p.connections.outbound : null });
  return { records: st.pods.filter((p) => p.state !== 'orphan').length, orphans: st.pods.filter((p) => p.state === 'orphan').length, problems: st.problems, byPod };
}

function applyDatapath(d: DatapathView, views: Map<string, PodView>): void {
  for (const v of views.values()) {
    const p = d.byPod.get(v.name);
    v.mode = p?.mode ?? null;
    v.captured = p?.captured ?? null;
  }
}

function applyCniEvents(agent: SandboxAgent, views: Map<string, PodView>): void {
  for (const e of agent.events) {
    const v = views.get(e.pod);
    if (!v) continue;
    if (e.verb === 'ADD') v.cniAdd = e.result;
    if (e.verb === 'DEL') v.cniDel = e.result;
  }
}

async function runPhase(mode: Mode, plan: SandboxPlan, rt: Runtime, cleanup: Cleanup, screen: Screen, o: SandboxOptions): Promise<PhaseReport> {
  const t0 = performance.now();
  const signal = o.signal;
  const title = mode === 'ebpf' ? 'eBPF mode' : 'iptables mode';
  screen.log('');
  screen.log(`── ${title} ${'─'.repeat(60)}`);
  let agent: SandboxAgent;
  try {
    agent = await startSandboxAgent(plan, mode, cleanup, signal);
  } catch (e) {
    const msg = (e as Error).message;
    if (/eBPF mode refused on this node/.test(msg)) {
      screen.log(`${title}: skipped, this kernel cannot run it: ${msg.split('\n').find((l) => /refused/.test(l))?.trim()}`);
      return { mode, status: 'skipped', reason: msg, pods: [], checks: [], cni: [], durationMs: Math.round(performance.now() - t0) };
    }
    throw e;
  }
  screen.log(`agent: meshcap agent --standalone --mode ${mode} (${agent.reasons.join('; ')})${mode === 'ebpf' ? `, pins under ${agent.pinRoot}` : ''}`);

  const views = new Map<string, PodView>();
  for (const p of plan.pods) views.set(p.name, newView(p.name, p.role, '', plan.connections));
  const ordered = () => plan.pods.map((p) => views.get(p.name)!);
  const draw = () => screen.setBlock(renderTable(ordered()));
  const pods = new Map<string, PodHandle>();

  // The server first: the clients need its address.
  const tPods = performance.now();
  const server = await rt.createPod('server', signal);
  pods.set('server', server);
  views.get('server')!.ip = server.ip;
  const serverProc = rt.run(server, 'server', [process.execPath, WORKLOAD, 'server', '--ports', plan.serverPorts.join(',')]);
  serverProc.onLine((l) => onWorkloadLine(views.get('server')!, l));

  // Client pods in parallel: sandbox (CNI ADD) and the sidecar; the app waits for its sidecar, as Istio's holdApplicationUntilProxyStarts.
  const sidecars: Proc[] = [];
  // allSettled: when one pod fails, the others finish registering their undo before cleanup runs.
  const created = await Promise.allSettled(
    clientPods(plan).map(async (p) => {
      const pod = await rt.createPod(p.name, signal);
      pods.set(p.name, pod);
      const v = views.get(p.name)!;
      v.ip = pod.ip;
      // Meshed: the pod's istio-proxy. Unmeshed: the same listener as a trap that must stay empty.
      const proxy = rt.run(pod, ISTIO_PROXY_CONTAINER, [process.execPath, MESHCAP, 'proxy'], { uid: plan.proxyUid });
      proxy.onLine((l) => onProxyLine(v, l));
      sidecars.push(proxy);
      await proxy.waitFor(/"event":"ready"/, plan.startupTimeoutMs, signal);
    }),
  );
  const failedPod = created.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failedPod) throw failedPod.reason;
  await serverProc.waitFor(/"event":"ready"/, plan.startupTimeoutMs, signal);
  applyCniEvents(agent, views);
  screen.log(`pods: ${plan.pods.length} on ${plan.subnet} via CNI ADD (bridge → host-local → meshcap-cni → agent) in ${Math.round(performance.now() - tPods)} ms; server ${server.ip}:${plan.serverPorts.join(',')}`);

  // Traffic: every client pod dials the server's ports, bounded, one connection at a time.
  const targets = plan.serverPorts.map((port) => `${server.ip}:${port}`).join(',');
  const clients = clientPods(plan).map((p) => {
    const c = rt.run(pods.get(p.name)!, 'app', [process.execPath, WORKLOAD, 'client', '--targets', targets, '--count', String(plan.connections), '--interval-ms', String(plan.intervalMs), '--timeout-ms', String(plan.deadlines.connection)]);
    c.onLine((l) => onWorkloadLine(views.get(p.name)!, l));
    return c;
  });
  screen.log(`traffic: ${clients.length} pods × ${plan.connections} connections to ${targets}`);
  const budgetMs = plan.connections * (plan.intervalMs + plan.deadlines.connection) + plan.startupTimeoutMs;
  const allDone = Promise.all(clients.map((c) => c.exited));
  let finished = false;
  void allDone.then(() => (finished = true));
  const deadline = performance.now() + budgetMs;
  let lastStatus = 0;
  while (!finished && performance.now() < deadline) {
    if (performance.now() - lastStatus > 1000) {
      lastStatus = performance.now();
      await readDatapath(agent).then((d) => applyDatapath(d, views), () => undefined);
    }
    draw();
    await sleep(250, signal);
  }
  if (!finished) {
    screen.log(`traffic: clients still running after ${budgetMs} ms: stopping them`);
    await Promise.all(clients.map((c) => c.stop(2000)));
  }
  for (const c of clients) {
    const r = await c.exited;
    if (r.code !== 0) screen.log(`${c.name} exited ${r.code ?? r.signal}: ${c.stderr().trim().split('\n').slice(-2).join(' | ')}`);
  }
  const before = await readDatapath(agent);
  applyDatapath(before, views);
  applyCniEvents(agent, views);
  draw();

  // Teardown of the pods runs CNI DEL while the agent still serves.
  for (const s of sidecars) await s.stop(2000);
  const clientHandles = clientPods(plan).map((p) => pods.get(p.name)!);
  await abortable(Promise.all(clientHandles.map((h) => rt.deletePod(h))), signal);
  await abortable(rt.deletePod(server), signal);
  // The agent logs each request when it answers; give the last lines a moment to arrive.
  for (let i = 0; i < 20 && agent.events.filter((e) => e.verb === 'DEL').length < plan.pods.length; i++) await sleep(100, signal);
  applyCniEvents(agent, views);
  // Only counted here: the table and the checks keep the counters from before the DEL.
  const after = await readDatapath(agent).catch((e: Error) => ({ records: -1, orphans: -1, problems: [e.message] }));
  draw();
  screen.commit();
  await agent.stop();

  const checks = checkPhase(ordered(), mode);
  checks.push({ ok: after.records === 0 && after.orphans === 0, text: `after DEL the agent holds no pod state (${after.records} records, ${after.orphans} datapath entries without a record)` });
  checks.push({ ok: before.problems.length === 0, text: `meshcap status read the datapath without problems${before.problems.length ? `: ${before.problems.join('; ')}` : ''}` });
  const failed = checks.filter((c) => !c.ok);
  const meshed = ordered().filter((v) => v.role === 'meshed');
  const unmeshed = ordered().filter((v) => v.role === 'unmeshed');
  const mp50 = percentile(meshed.flatMap((v) => v.latencies), 50);
  const up50 = percentile(unmeshed.flatMap((v) => v.latencies), 50);
  screen.log(TABLE_LEGEND);
  screen.log(
    `${title}: ${failed.length === 0 ? 'PASS' : `FAIL (${failed.length} of ${checks.length} checks)`} — ` +
      `${meshed.reduce((a, v) => a + [...v.proxySaw.values()].reduce((x, y) => x + y, 0), 0)} connections reached a sidecar with their original destination; ` +
      `${unmeshed.reduce((a, v) => a + v.ok, 0)} unmeshed connections went straight to the server` +
      (mp50 !== null && up50 !== null ? `; median ${mp50.toFixed(2)} ms meshed vs ${up50.toFixed(2)} ms direct` : ''),
  );
  const shown = renderChecks(checks, o.verbose ?? false);
  if (shown) screen.log(shown);
  return { mode, status: failed.length ? 'failed' : 'passed', pods: ordered().map(summary), checks, cni: [...agent.events], durationMs: Math.round(performance.now() - t0) };
}

/** What this run could have left: none of it may exist after cleanup. */
async function leftovers(plan: SandboxPlan): Promise<string[]> {
  const left: string[] = [];
  if (await linkExists(plan.bridge)) left.push(`bridge ${plan.bridge}`);
  const ns = await listNetns(netnsName(plan, ''));
  left.push(...ns.map((n) => `netns ${n}`));
  const parent = path.dirname(PIN_PREFIX);
  if (existsSync(parent)) left.push(...readdirSync(parent).map((e) => path.join(parent, e)).filter((p) => p.startsWith(`${PIN_PREFIX}${plan.id}-`)).map((p) => `pins ${p}`));
  if (existsSync(plan.runDir)) left.push(`directory ${plan.runDir}`);
  const results = '/var/lib/cni/results';
  if (existsSync(results)) left.push(...readdirSync(results).filter((f) => f.startsWith(`${plan.network}-`)).map((f) => `CNI cache ${path.join(results, f)}`));
  return left;
}

export async function runSandbox(o: SandboxOptions = {}): Promise<SandboxReport> {
  const t0 = performance.now();
  const out = o.out ?? process.stdout;
  const screen = new Screen(out, o.live ?? false);
  const modes = o.modes ?? ['ebpf', 'iptables'];
  preflight();
  for (const line of await recoverStaleRuns(o.runRoot ?? SANDBOX_RUN_ROOT)) screen.log(`cleanup of an earlier run: ${line}`);

  const plan = makePlan(o);
  const cleanup = new Cleanup();
  const phases: PhaseReport[] = [];
  let rt: Runtime | undefined;
  let error: string | undefined;
  let interrupted: string | undefined;
  try {
    mkdirSync(plan.runDir, { recursive: true, mode: 0o700 });
    cleanup.add(`run directory ${plan.runDir}`, async () => {
      await removeRunDir(plan.runDir);
      // The parent is shared by concurrent runs: only an empty one goes.
      try {
        rmdirSync(path.dirname(plan.runDir));
      } catch {
        /* another run's directory is in it */
      }
    });
    const chosen = await chooseRuntime(o.runtime ?? 'auto', plan, cleanup);
    rt = chosen.rt;
    writeRunRecord(plan, rt.kind);
    screen.log(`meshcap sandbox ${plan.id}: ${plan.pods.filter((p) => p.role === 'meshed').length} meshed pods + 1 unmeshed pod + a server, ${modes.map((m) => (m === 'ebpf' ? 'eBPF' : m)).join(' then ')} mode`);
    if (chosen.note) screen.log(`note: ${chosen.note}`);
    screen.log(`runtime: ${rt.description}`);
    screen.log(`network: ${plan.network} on bridge ${plan.bridge}, ${plan.subnet} (no host address, no routes out), CNI chain bridge → host-local → meshcap-cni`);
    writeFileSync(plan.podsFile, podsYaml(plan));
    await rt.prepare(o.signal);
    for (const mode of modes) phases.push(await runPhase(mode, plan, rt, cleanup, screen, o));
  } catch (e) {
    if (e instanceof SignalAbort || o.signal?.aborted) interrupted = (o.signal?.reason as Error | undefined)?.message ?? (e as Error).message;
    else error = (e as Error).message;
    screen.commit();
    screen.log(interrupted ? `interrupted (${interrupted}): cleaning up` : `error: ${error}`);
  }

  const steps = await cleanup.run();
  const failedSteps = steps.filter((s) => s.error);
  const left = await leftovers(plan);
  screen.log(
    `cleanup: ${steps.length - failedSteps.length}/${steps.length} steps (pods, agents and pins, bridge, CNI cache, run dir)` +
      (failedSteps.length ? `; FAILED: ${failedSteps.map((s) => `${s.label}: ${s.error}`).join('; ')}` : '') +
      (left.length ? `; still present: ${left.join(', ')}` : '; nothing left behind'),
  );

  const ran = phases.filter((p) => p.status !== 'skipped');
  const ok = !error && !interrupted && ran.length > 0 && ran.every((p) => p.status === 'passed') && failedSteps.length === 0 && left.length === 0;
  const verdict = ok
    ? `meshcap works here: ${ran.map((p) => (p.mode === 'ebpf' ? 'eBPF' : 'iptables')).join(' and ')} mode on ${rt?.kind === 'podman' ? 'podman containers' : 'network namespaces'}; ` +
      'every meshed connection reached its sidecar with its original destination, the unmeshed pod was left alone, and nothing is left behind' +
      (phases.some((p) => p.status === 'skipped') ? ` (skipped: ${phases.filter((p) => p.status === 'skipped').map((p) => p.mode).join(', ')})` : '')
    : interrupted
      ? `interrupted; ${left.length ? `left behind: ${left.join(', ')}` : 'everything the sandbox created was removed'}`
      : `FAILED: ${[
          error,
          ...phases.filter((p) => p.status === 'failed').map((p) => {
            const bad = p.checks.filter((c) => !c.ok);
            return `${p.mode} mode: ${bad.length} of ${p.checks.length} checks failed (first: ${bad[0]!.text})`;
          }),
          ...failedSteps.map((s) => `cleanup ${s.label}: ${s.error}`),
          ...left.map((l) => `left behind: ${l}`),
          ran.length === 0 && !error ? 'no mode could run' : undefined,
        ].filter(Boolean).join(' | ')}`;
  screen.log('');
  screen.log(`VERDICT: ${verdict}`);
  return {
    id: plan.id,
    runtime: { kind: rt?.kind ?? 'netns', description: rt?.description ?? '-' },
    subnet: plan.subnet,
    phases,
    cleanup: steps,
    leftovers: left,
    ...(interrupted ? { interrupted } : {}),
    ...(error ? { error } : {}),
    ok,
    verdict,
    durationMs: Math.round(performance.now() - t0),
  };
}

