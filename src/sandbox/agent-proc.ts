// The meshcap agent as the sandbox runs it: `meshcap agent --standalone`, a
// separate process exactly as an operator would start it, with its pino
// lines read back to see every CNI request that reached it.
import { mkdirSync } from 'node:fs';
import { uninstallDatapath } from '../loader/datapath.js';
import type { Mode } from '../loader/mode.js';
import { projectRoot } from '../paths.js';
import { abortable, type Cleanup } from './cleanup.js';
import { pinRootOf, stateDirOf, type SandboxPlan } from './plan.js';
import { startProc, tail, type Proc } from '../lab/process.js';

export interface CniEvent {
  verb: string;
  pod: string;
  containerId: string;
  result: 'ok' | 'error';
  durationMs: number;
  code?: number;
  error?: string;
}

export interface SandboxAgent {
  mode: Mode;
  reasons: string[];
  pinRoot: string;
  stateDir: string;
  events: CniEvent[];
  proc: Proc;
  /** SIGTERM the agent and, in eBPF mode, remove its pins. */
  stop(): Promise<void>;
}

export async function startSandboxAgent(plan: SandboxPlan, mode: Mode, cleanup: Cleanup, signal?: AbortSignal): Promise<SandboxAgent> {
  const pinRoot = pinRootOf(plan, mode);
  const stateDir = stateDirOf(plan, mode);
  mkdirSync(stateDir, { recursive: true });
  const proc = startProc(`meshcap agent (${mode})`, process.execPath, [
    `${projectRoot}/bin/meshcap`, 'agent', '--standalone',
    '--pods', plan.podsFile,
    '--socket', plan.socket,
    '--pin-root', pinRoot,
    '--mode', mode,
    '--state-dir', stateDir,
  ]);
  const events: CniEvent[] = [];
  proc.onLine((l) => {
    let j: Record<string, unknown>;
    try {
      j = JSON.parse(l) as Record<string, unknown>;
    } catch {
      return;
    }
    if (j.msg !== 'cni request' || typeof j.verb !== 'string') return;
    events.push({
      verb: j.verb,
      pod: typeof j.podName === 'string' ? j.podName : '',
      containerId: typeof j.containerId === 'string' ? j.containerId : '',
      result: j.result === 'ok' ? 'ok' : 'error',
      durationMs: Number(j.durationMs ?? 0),
      ...(typeof j.code === 'number' ? { code: j.code } : {}),
      ...(typeof j.error === 'string' ? { error: j.error } : {}),
    });
  });
  let stopped = false;
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    await proc.stop(5000);
    // The agent leaves the datapath in place on purpose (a restart adopts it); the sandbox is done with it.
    if (mode === 'ebpf') {
      const u = uninstallDatapath(pinRoot);
      if (u.leftBehind.length) throw new Error(`pins left under ${pinRoot}: ${u.leftBehind.join(', ')}`);
    }
  };
  cleanup.add(`meshcap agent (${mode}) and its pins ${pinRoot}`, stop);
  // The agent loads and attaches the datapath before it serves: under load that takes seconds.
  const ready = await abortable(proc.waitFor(/"msg":"meshcap agent ready"/, plan.startupTimeoutMs, signal), signal).catch((e: Error) => {
    throw new Error(`the meshcap agent did not start in ${mode} mode: ${e.message}${proc.lines.length ? tail(proc.lines.join('\n'), 4) : ''}`);
  });
  const r = JSON.parse(ready) as { mode: Mode; reasons?: string[] };
  return { mode: r.mode, reasons: r.reasons ?? [], pinRoot, stateDir, events, proc, stop };
}
