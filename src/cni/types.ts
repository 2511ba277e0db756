// What the agent implements: the CNI verbs as handlers. The protocol layer
// (src/cni/server.ts) validates requests and builds every answer; handlers
// only decide and act, and throw CniError for spec errors.
import type { NetConf } from './netconf.js';
import type { CniCommand } from './rules.js';

export type { CniCommand };

export interface CniRequest {
  command: CniCommand;
  /** CNI_CONTAINERID ('' for STATUS and GC). */
  containerId: string;
  /** CNI_NETNS as given: may be '' for DEL, may not exist any more. */
  netns: string;
  /** CNI_IFNAME ('' for STATUS and GC). */
  ifname: string;
  /** CNI_ARGS parsed (K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_INFRA_CONTAINER_ID, K8S_POD_UID, ...). */
  args: Record<string, string>;
  podNamespace?: string;
  podName?: string;
  cniVersion: string;
  /** The parsed network config, incl. prevResult, name, type and plugin-specific keys. */
  config: NetConf;
  /**
   * ADD: the cookie of CNI_NETNS's netns as the forwarder read it just before
   * (SO_NETNS_COOKIE in that netns), so the agent need not enter the netns;
   * absent when the forwarder could not (or is older).
   */
  netnsCookie?: bigint;
}

/** What ADD decided, for the request's log line. */
export interface AddOutcome {
  /** e.g. 'meshed', 'not meshed: <reason>', 'namespace excluded'. */
  decision: string;
  /** The datapath the pod got, when meshed. */
  mode?: string;
}

export interface CniHandlers {
  /** Sets up the pod; the server answers prevResult (converted): handlers never build results. */
  add(req: CniRequest): Promise<AddOutcome | void>;
  del(req: CniRequest): Promise<void>;
  check(req: CniRequest): Promise<void>;
  /** Throw CniError(50/51) when not ready. */
  status(req: CniRequest): Promise<void>;
  gc(req: CniRequest, validAttachments: { containerId: string; ifname: string }[]): Promise<void>;
}
