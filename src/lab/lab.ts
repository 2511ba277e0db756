// One lab: the namespaces, veth pairs and processes a test file, a bench or
// the sandbox makes, named `<prefix>-<short>-<id>` so a crashed run's
// leftovers are recognisable, each registered for removal the moment it
// exists (close() undoes them in reverse: processes, then namespaces), and
// the namespaces also removed synchronously at process exit if close()
// never ran.
import { randomBytes } from 'node:crypto';
import { atExit, Cleanup, type CleanupStep } from './cleanup.js';
import { addNetns, delNetns, delNetnsSync, netnsPath, type AddNetnsOpts } from './netns.js';
import { inNetns, startProc, type InNetnsOpts, type Proc } from './process.js';
import { addVeth } from './veth.js';

export interface LabNetns {
  name: string;
  path: string;
}

export interface LinkAddrs {
  a4?: string[];
  b4?: string[];
  a6?: string[];
  b6?: string[];
}

export class Lab {
  readonly id: string;
  private registry = new Cleanup();
  private links = 0;

  /** prefix: the first part of every name (short: it is also the veth names' prefix); id: default 6 random hex digits. */
  constructor(readonly prefix: string, id?: string) {
    this.id = id ?? randomBytes(3).toString('hex');
  }

  /** Register an undo of something the caller made in this lab (pins, rules, temp dirs). */
  add(label: string, undo: () => Promise<unknown> | unknown): void {
    this.registry.add(label, undo);
  }

  async netns(short: string, o: AddNetnsOpts = {}): Promise<LabNetns> {
    const name = `${this.prefix}-${short}-${this.id}`;
    const dropAtExit = atExit(() => delNetnsSync(name));
    try {
      await addNetns(name, o);
    } catch (e) {
      dropAtExit();
      throw e;
    }
    this.registry.add(`netns ${name}`, async () => {
      await delNetns(name);
      dropAtExit();
    });
    return { name, path: netnsPath(name) };
  }

  /** veth between two namespaces of this lab (a === b: both ends in one), addresses from the lab ranges only; no default route. */
  async link(a: string, b: string, addrs: LinkAddrs): Promise<{ aIf: string; bIf: string }> {
    const n = this.links++;
    const aIf = `${this.prefix}${this.id}${n}a`;
    const bIf = `${this.prefix}${this.id}${n}b`;
    await addVeth({ ns: a, ifname: aIf, v4: addrs.a4, v6: addrs.a6 }, { ns: b, ifname: bIf, v4: addrs.b4, v6: addrs.b6 });
    return { aIf, bIf };
  }

  /** `ip` arguments that run cmd in ns (see inNetns). */
  argv(ns: string, cmd: string[], o: InNetnsOpts = {}): string[] {
    return inNetns(ns, cmd, o);
  }

  /** A long-running process in ns, in its own process group, stopped (SIGTERM, then SIGKILL) by close(). */
  start(name: string, ns: string, cmd: string[], o: InNetnsOpts & { graceMs?: number } = {}): Proc {
    const p = startProc(name, 'ip', inNetns(ns, cmd, o));
    this.registry.add(`process ${name}`, () => p.stop(o.graceMs ?? 1000));
    return p;
  }

  /** Undo everything so far, last first; the lab can be used again afterwards. */
  close(onStep?: (s: CleanupStep) => void): Promise<CleanupStep[]> {
    const r = this.registry;
    this.registry = new Cleanup();
    return r.run(onStep);
  }
}
