// Each run records itself in <run dir>/run.json. A run that was killed
// outright (SIGKILL, power loss of the terminal) could not clean up; the next
// run finds its record with a dead pid and removes what it left: containers,
// namespaces, processes, the bridge, pins, CNI cache entries, the run dir.
import { existsSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import { delNetns, listNetns, netnsPids } from '../lab/netns.js';
import { uninstallDatapath } from '../loader/datapath.js';
import { parseMountinfo } from '../loader/mounts.js';
import { PIN_PREFIX, SANDBOX_RUN_ROOT, type SandboxPlan } from './plan.js';
import { cleanCniCache, cniCacheSnapshot, deleteBridge } from './runtime.js';

export interface RunRecord {
  id: string;
  pid: number;
  /** the pid's start time (clock ticks after boot, /proc/PID/stat field 22): a reused pid is not this run */
  pidStart: string;
  startedAt: string;
  runtime: string;
  bridge: string;
  network: string;
  /** whether /var/lib/cni (and its results/) existed before the run: only then do they stay */
  cniCache: { existed: boolean; resultsExisted: boolean };
}

export function writeRunRecord(plan: SandboxPlan, runtime: string): void {
  const rec: RunRecord = { id: plan.id, pid: process.pid, pidStart: procStart(process.pid) ?? '', startedAt: new Date().toISOString(), runtime, bridge: plan.bridge, network: plan.network, cniCache: cniCacheSnapshot() };
  writeFileSync(path.join(plan.runDir, 'run.json'), JSON.stringify(rec, null, 2) + '\n');
}

const readMounts = () => parseMountinfo(readFileSync('/proc/self/mountinfo', 'utf8'));

function cmdline(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ');
  } catch {
    return '';
  }
}

function procStart(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // comm (field 2) may hold spaces and parentheses: count fields after the last ')'.
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
  } catch {
    return undefined;
  }
}

const alive = (rec: RunRecord) => procStart(rec.pid) === rec.pidStart;

/**
 * Remove the run dir without ever descending into a mount (an overlay of the
 * host's root lives under it while a container runs): unmount what is still
 * mounted below it first, then `rm --one-file-system`.
 */
export async function removeRunDir(dir: string): Promise<void> {
  if (!existsSync(dir)) return;
  const below = readMounts()
    .map((m) => m.mountPoint)
    .filter((p) => p.startsWith(dir + '/'))
    .sort((a, b) => b.length - a.length);
  for (const m of below) await execa('umount', ['-l', m], { reject: false });
  const still = readMounts().map((m) => m.mountPoint).filter((p) => p.startsWith(dir + '/'));
  if (still.length) throw new Error(`not removing ${dir}: still mounted below it: ${still.join(', ')}`);
  const r = await execa('rm', ['-rf', '--one-file-system', dir], { reject: false });
  if (r.exitCode !== 0 || existsSync(dir)) throw new Error(`cannot remove ${dir}: ${r.stderr.trim()}`);
}

/** Runs whose process is gone, with what they left; removes it all. Returns one line per removed run. */
export async function recoverStaleRuns(root = SANDBOX_RUN_ROOT): Promise<string[]> {
  if (!existsSync(root)) return [];
  const done: string[] = [];
  for (const id of readdirSync(root)) {
    if (!/^[0-9a-f]{6}$/.test(id)) continue;
    const dir = path.join(root, id);
    let rec: RunRecord;
    try {
      rec = JSON.parse(readFileSync(path.join(dir, 'run.json'), 'utf8')) as RunRecord;
    } catch {
      continue; // a run still writing its record, or not ours: leave it
    }
    if (alive(rec)) continue;
    const problems: string[] = [];
    const step = async (what: string, f: () => Promise<unknown>) => {
      try {
        await f();
      } catch (e) {
        problems.push(`${what}: ${(e as Error).message}`);
      }
    };
    if (existsSync(path.join(dir, 'podman-root'))) {
      await step('podman containers', async () => {
        const env = { ...process.env, CONTAINERS_CONF: path.join(dir, 'containers.conf') };
        const base = ['--root', path.join(dir, 'podman-root'), '--runroot', path.join(dir, 'podman-run'), '--storage-driver', 'vfs'];
        for (let i = 0; i < 3; i++) await execa('podman', [...base, 'rm', '-a', '-f', '-t', '0'], { env, reject: false, timeout: 60_000 });
      });
    }
    await step('namespaces', async () => {
      for (const n of await listNetns(`mcsb-${id}-`)) {
        for (const p of await netnsPids(n)) process.kill(p, 'SIGKILL');
        await delNetns(n);
      }
    });
    await step('processes', async () => {
      for (const p of readdirSync('/proc').filter((x) => /^\d+$/.test(x))) {
        if (Number(p) !== process.pid && cmdline(Number(p)).includes(dir + '/')) {
          try {
            process.kill(Number(p), 'SIGKILL');
          } catch {
            /* gone */
          }
        }
      }
    });
    await step('bridge', () => deleteBridge(rec.bridge));
    await step('pins', async () => {
      const parent = path.dirname(PIN_PREFIX);
      for (const e of existsSync(parent) ? readdirSync(parent) : []) {
        const p = path.join(parent, e);
        if (p.startsWith(`${PIN_PREFIX}${id}-`)) {
          const u = uninstallDatapath(p);
          if (u.leftBehind.length) throw new Error(`left ${u.leftBehind.join(', ')}`);
        }
      }
    });
    await step('CNI cache', async () => cleanCniCache(rec.network, rec.cniCache ?? { existed: true, resultsExisted: true }));
    await step('run dir', () => removeRunDir(dir));
    done.push(`removed what run ${id} (pid ${rec.pid}, ${rec.runtime}, started ${rec.startedAt}) left behind${problems.length ? `; could not remove: ${problems.join('; ')}` : ''}`);
  }
  // Only an empty parent goes: a live run's directory keeps it.
  try {
    if (done.length && readdirSync(root).length === 0) rmdirSync(root);
  } catch {
    /* a run just created its directory in it */
  }
  return done;
}
