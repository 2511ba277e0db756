// The agent's CNI verbs. One way through: request -> pod lookup -> decision
// (src/decision/, pure) -> datapath write (src/pod-datapath/) -> state record.
// Every ADD that should capture either has its redirect in place before it
// answers or fails with a CniError naming the pod and the cause.
import { statSync } from 'node:fs';
import type { Logger } from 'pino';
import { CniError } from '../cni/errors.js';
import { CNI_ERROR_CODES } from '../cni/rules.js';
import type { AddOutcome, CniHandlers, CniRequest } from '../cni/types.js';
import { decideAdd } from '../decision/add.js';
import { namespaceExclusion } from '../decision/meshed.js';
import type { PodSource } from '../kube/pod-source.js';
import type { PodTarget } from '../pod-datapath/backend.js';
import type { PodDatapath } from '../pod-datapath/pod-datapath.js';
import type { Mode } from '../loader/mode.js';
import { CaptureConfigError } from '../redirect/config.js';
import { MapFullError } from '../maps/map-full.js';
import { netnsCookie } from '../pod-netns.js';
import { KeyedLock } from './keyed-lock.js';
import { configOf, cookieOf, recordSettings, sharedConfig, STATE_VERSION, type AttachmentRecord, type StateStore } from './state-store.js';

/** meshcap's own codes (the spec leaves 100+ to plugins). */
export const AGENT_ERROR_CODES = {
  /** ADD: the pod should be meshed but its redirect could not be set up. */
  SETUP_FAILED: 100,
  /** CHECK: the pod's datapath state is missing or differs. */
  CHECK_FAILED: 101,
  /** DEL/GC: the redirect could not be removed from a live netns. */
  TEARDOWN_FAILED: 102,
} as const;

export interface AgentHandlerDeps {
  pods: PodSource;
  store: StateStore;
  datapath: PodDatapath;
  nodeMode: Mode;
  excludeNamespaces: readonly string[];
  /** How long ADD waits for a pod the pod source does not know yet. */
  podWaitMs: number;
  logger: Logger;
  /** Readiness for STATUS: undefined when ready, else why not. */
  notReady(): string | undefined;
  /** Per-container lock, shared with the reconciler so a restore never races an ADD or DEL. */
  lock?: KeyedLock;
}

function podRef(req: CniRequest): { ns: string; name: string } {
  if (!req.podNamespace || !req.podName) {
    throw new CniError(
      CNI_ERROR_CODES.INVALID_ENV,
      'CNI_ARGS must carry K8S_POD_NAMESPACE and K8S_POD_NAME: meshcap finds the pod (and whether it is meshed) by them',
    );
  }
  return { ns: req.podNamespace, name: req.podName };
}

const causeOf = (err: unknown) => (err instanceof Error ? err.message : String(err));
/** `held` when it equals `s` (the same text, one copy kept), else `s`. */
const sameOr = (held: string | undefined, s: string) => (held === s ? held : s);

/** Two records of the same network namespace (same cookie, else same path). */
const SELF_NETNS = '/proc/self/ns/net';
/** The agent's own netns never changes: stat it once. */
let selfNetns: { dev: number; ino: number } | undefined;

/** Whether `netns` is the network namespace the agent itself runs in (the host's: the agent uses hostNetwork). */
export function isHostNetns(netns: string, self = SELF_NETNS): boolean {
  try {
    const a = statSync(netns);
    const b = self === SELF_NETNS ? (selfNetns ??= statSync(self)) : statSync(self);
    return a.dev === b.dev && a.ino === b.ino;
  } catch {
    return false; // a path that does not exist is register()'s error to report
  }
}

/**
 * The agent's own netns cookie, looked up once (a setns on a helper thread):
 * an ADD whose forwarder sent CNI_NETNS's cookie is told from the host's by
 * comparing the two (cookies name one netns each for the boot), without
 * isHostNetns's stat (~16 us of the ADD). Undefined until known, or when the
 * kernel cannot tell it: the stat then decides.
 */
let selfCookie: bigint | undefined;
let selfCookieAsked = false;
function lookUpSelfCookie(): void {
  if (selfCookieAsked) return;
  selfCookieAsked = true;
  netnsCookie(SELF_NETNS).then((c) => { selfCookie = c; }, () => undefined);
}

/** Whether the request's netns is the agent's own: by cookie when both are known, else by stat. */
function isHostRequest(req: CniRequest): boolean {
  if (req.netnsCookie !== undefined && selfCookie !== undefined) return req.netnsCookie === selfCookie;
  return isHostNetns(req.netns);
}

export function targetOf(rec: AttachmentRecord): PodTarget {
  return { mode: rec.mode, netns: rec.netns, config: configOf(rec), podIPs: rec.podIPs };
}

export function createAgentHandlers(d: AgentHandlerDeps): CniHandlers & { removeAttachment(rec: AttachmentRecord): Promise<void> } {
  const lock = d.lock ?? new KeyedLock();
  const log = d.logger.child({ component: 'cni' });
  lookUpSelfCookie();

  /** Undo one attachment and forget it; the netns may be gone. */
  async function removeAttachment(rec: AttachmentRecord): Promise<void> {
    const pod = `${rec.podNamespace}/${rec.podName}`;
    // One netns, several attachments (Multus: eth0 and net1 each run the
    // chain): the capture is the netns's, so it stays until the last one goes.
    const sibling = d.store.siblingOf(rec);
    if (sibling) {
      log.info({ pod, containerId: rec.containerId, ifname: rec.ifname, keptBy: `${sibling.containerId}@${sibling.ifname}` }, 'attachment removed; the netns stays captured for its other attachment');
      await d.store.remove(rec.containerId, rec.ifname);
      return;
    }
    try {
      const outcome = await d.datapath.unregister(targetOf(rec), cookieOf(rec));
      if (outcome !== 'removed') log.debug({ pod, netns: rec.netns, outcome }, 'nothing to remove in the netns');
    } catch (err) {
      throw new CniError(AGENT_ERROR_CODES.TEARDOWN_FAILED, `cannot remove the ${rec.mode} redirect of pod ${pod} (netns ${rec.netns}): ${causeOf(err)}`);
    }
    await d.store.remove(rec.containerId, rec.ifname);
  }

  async function add(req: CniRequest): Promise<AddOutcome> {
    const { ns, name } = podRef(req);
    const pod = `${ns}/${name}`;
    if (namespaceExclusion(ns, { excludeNamespaces: d.excludeNamespaces })) return { decision: 'namespace excluded' };

    const obj = await d.pods.waitFor(ns, name, d.podWaitMs);
    if (!obj) {
      throw new CniError(
        CNI_ERROR_CODES.TRY_AGAIN_LATER,
        `pod ${pod} is not known to the agent's pod source after ${d.podWaitMs} ms; the runtime will retry`,
      );
    }
    let decision;
    try {
      decision = decideAdd(obj, { nodeMode: d.nodeMode, prevResult: req.config.prevResult });
    } catch (err) {
      const code = err instanceof CaptureConfigError ? CNI_ERROR_CODES.INVALID_NETWORK_CONFIG : AGENT_ERROR_CODES.SETUP_FAILED;
      throw new CniError(code, `pod ${pod} is meshed but its capture config is invalid: ${causeOf(err)}`);
    }
    if (decision.kind === 'skip') return { decision: `not meshed: ${decision.reason}` };
    const config = sharedConfig(decision.config);
    if (decision.fallbackReason) log.warn({ pod, reason: decision.fallbackReason }, 'pod uses iptables mode on an eBPF node');

    await lock.run(req.containerId, async () => {
      const prev = d.store.get(req.containerId, req.ifname);
      // A retried ADD with a new decision (other mode or netns): undo the old one first.
      if (prev && (prev.mode !== decision.mode || prev.netns !== req.netns)) await removeAttachment(prev);
      if (isHostRequest(req)) {
        throw new CniError(CNI_ERROR_CODES.INVALID_ENV, `pod ${pod}: CNI_NETNS ${req.netns} is the host's own network namespace; meshcap never captures the host (a hostNetwork pod is not meshed)`);
      }
      const target: PodTarget = { mode: decision.mode, netns: req.netns, config, podIPs: decision.podIPs };
      let cookie: bigint | null;
      try {
        cookie = await d.datapath.register(req.netnsCookie !== undefined ? { ...target, netnsCookie: req.netnsCookie } : target);
      } catch (err) {
        await d.datapath.unregister(target, null).catch(() => undefined);
        const e = new CniError(AGENT_ERROR_CODES.SETUP_FAILED, `cannot set up the ${decision.mode} redirect of pod ${pod} in ${req.netns}: ${causeOf(err)}`);
        e.cause = err; // metrics count MapFullError refusals by map
        if (err instanceof MapFullError) log.error({ pod, netns: req.netns, map: err.map, maxEntries: err.maxEntries, needed: err.needed }, 'pod refused: an eBPF map is full');
        throw e;
      }
      const rec: AttachmentRecord = {
        version: STATE_VERSION,
        containerId: req.containerId,
        ifname: req.ifname,
        // The pod object's strings where equal: the request's own copies
        // cost ~0.5 MiB of heap at 10,000 pods (docs/bench-scale.md).
        podNamespace: sameOr(obj.metadata?.namespace, ns),
        podName: sameOr(obj.metadata?.name, name),
        ...(obj.metadata?.uid ? { podUid: obj.metadata.uid } : {}),
        netns: req.netns,
        netnsCookie: cookie === null ? null : cookie.toString(),
        mode: decision.mode,
        ...(decision.fallbackReason ? { modeReason: decision.fallbackReason } : {}),
        profile: decision.profile,
        settings: recordSettings(config),
        podIPs: decision.podIPs,
        createdAt: prev?.createdAt ?? new Date().toISOString(),
      };
      try {
        await d.store.put(rec);
      } catch (err) {
        // Without its record nobody would ever remove this redirect.
        await d.datapath.unregister(target, cookie).catch(() => undefined);
        throw new CniError(AGENT_ERROR_CODES.SETUP_FAILED, `cannot record pod ${pod} in ${d.store.dir}: ${causeOf(err)}`);
      }
    });
    return { decision: 'meshed', mode: decision.mode };
  }

  async function del(req: CniRequest): Promise<void> {
    await lock.run(req.containerId, async () => {
      const rec = d.store.get(req.containerId, req.ifname);
      if (rec) await removeAttachment(rec);
    });
  }

  async function check(req: CniRequest): Promise<void> {
    const { ns, name } = podRef(req);
    const pod = `${ns}/${name}`;
    await lock.run(req.containerId, async () => {
      const rec = d.store.get(req.containerId, req.ifname);
      if (!rec) {
        // Nothing recorded is right only for a pod that is not meshed.
        if (namespaceExclusion(ns, { excludeNamespaces: d.excludeNamespaces })) return;
        const obj = d.pods.get(ns, name);
        if (!obj) throw new CniError(CNI_ERROR_CODES.TRY_AGAIN_LATER, `pod ${pod} is not known to the agent's pod source`);
        const decision = decideAdd(obj, { nodeMode: d.nodeMode, prevResult: req.config.prevResult });
        if (decision.kind === 'skip') return;
        throw new CniError(AGENT_ERROR_CODES.CHECK_FAILED, `pod ${pod} is meshed but has no redirect recorded for container ${req.containerId} (${req.ifname})`);
      }
      const problems = await d.datapath.check(targetOf(rec), cookieOf(rec));
      if (problems.length > 0) {
        throw new CniError(AGENT_ERROR_CODES.CHECK_FAILED, `pod ${pod} (${rec.mode} mode): ${problems.join('; ')}`, problems.join('\n'));
      }
    });
  }

  async function status(): Promise<void> {
    const why = d.notReady();
    if (why) throw new CniError(CNI_ERROR_CODES.PLUGIN_NOT_AVAILABLE, `meshcap agent is not ready: ${why}`);
  }

  async function gc(_req: CniRequest, valid: { containerId: string; ifname: string }[]): Promise<void> {
    const keep = new Set(valid.map((a) => `${a.containerId}\0${a.ifname}`));
    const stale = d.store.list().filter((r) => !keep.has(`${r.containerId}\0${r.ifname}`));
    const failures: string[] = [];
    for (const rec of stale) {
      await lock.run(rec.containerId, async () => {
        // Re-read under the lock: an ADD may have replaced it meanwhile.
        const now = d.store.get(rec.containerId, rec.ifname);
        if (!now) return;
        try {
          await removeAttachment(now);
        } catch (err) {
          failures.push(causeOf(err));
        }
      });
    }
    if (stale.length > 0) log.info({ removed: stale.length - failures.length, failed: failures.length }, 'gc removed stale attachments');
    if (failures.length > 0) throw new CniError(AGENT_ERROR_CODES.TEARDOWN_FAILED, `gc: ${failures.join('; ')}`);
  }

  return { add, del, check, status, gc, removeAttachment };
}
