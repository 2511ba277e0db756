// Writes, removes and verifies one pod's redirect in its mode, by handing it to
// that mode's backend (ebpf.ts or iptables.ts, both behind backend.ts's
// PodBackend). Knows nothing about CNI or pod objects: it gets a netns, a
// capture config and addresses.
import type { Logger } from 'pino';
import type { Mode } from '../loader/mode.js';
import type { KeySnapshot } from '../maps/registry.js';
import type { PodBackend, PodTarget, RemoveOutcome } from './backend.js';
import type { EbpfBackend } from './ebpf.js';
import { IptablesBackend } from './iptables.js';

export class PodDatapath {
  readonly iptables: IptablesBackend;

  /**
   * ebpf: the node's pinned maps, or null when the node runs iptables mode.
   * Replaced (not mutated) when the self-check reloads a lost datapath.
   */
  constructor(public ebpf: EbpfBackend | null, logger: Logger) {
    this.iptables = new IptablesBackend(logger);
  }

  /** The backend of a mode; eBPF only where the node loaded it. */
  backend(mode: Mode): PodBackend {
    if (mode === 'iptables') return this.iptables;
    if (!this.ebpf) throw new Error('the eBPF datapath is not loaded on this node (the agent runs in iptables mode)');
    return this.ebpf;
  }

  // async: a missing backend is a rejected promise, as callers' .catch() expect.

  /** Sets the pod up (idempotent). Returns its netns cookie (null if the kernel cannot tell it). */
  async register(t: PodTarget): Promise<bigint | null> {
    return this.backend(t.mode).register(t);
  }

  /** Removes the pod's redirect; fine when the netns is already gone. */
  async unregister(t: PodTarget, cookie: bigint | null): Promise<RemoveOutcome> {
    return this.backend(t.mode).unregister(t, cookie);
  }

  /** What is missing or different in the live datapath (empty: all present). */
  async check(t: PodTarget, cookie: bigint | null, snap?: KeySnapshot): Promise<string[]> {
    return this.backend(t.mode).check(t, cookie, snap);
  }
}
