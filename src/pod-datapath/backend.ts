// What every per-pod datapath backend does, whatever it writes: the pod's
// redirect set up, taken down, and compared with what it should be. One file
// per backend beside this one (ebpf.ts, iptables.ts), as containernetworking/
// plugins' portmap does it (portmap_iptables.go, portmap_nftables.go);
// pod-datapath.ts picks the backend by the pod's mode.
import type { Mode } from '../loader/mode.js';
import type { KeySnapshot } from '../maps/registry.js';
import type { CaptureConfig } from '../redirect/config.js';

/** One pod's redirect as a backend needs it: its netns path, capture config and addresses. */
export interface PodSetup {
  netns: string;
  config: CaptureConfig;
  podIPs: string[];
  /** register: the netns's cookie when already known (the forwarder read it); else the backend looks it up. */
  netnsCookie?: bigint;
}

/** A pod's redirect in a given mode (the agent's records carry the mode). */
export interface PodTarget extends PodSetup {
  mode: Mode;
}

export type RemoveOutcome = 'removed' | 'netns-gone' | 'netns-replaced';

export interface PodBackend {
  readonly mode: Mode;
  /** Sets the pod up (idempotent: a retried ADD). Returns its netns cookie (null if the kernel cannot tell it). */
  register(p: PodSetup): Promise<bigint | null>;
  /** Removes the pod's redirect; fine when the netns is already gone. `cookie` is the one recorded at register. */
  unregister(p: PodSetup, cookie: bigint | null): Promise<RemoveOutcome>;
  /**
   * What is missing or different in the live datapath (empty: all present),
   * including a netns that is gone or replaced. `snap`: one read of the eBPF
   * maps for a whole reconcile pass (EbpfBackend.snapshot); iptables ignores it.
   */
  check(p: PodSetup, cookie: bigint | null, snap?: KeySnapshot): Promise<string[]>;
}
