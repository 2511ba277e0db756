// The iptables backend: istio-iptables' rules (and routes) in the pod's netns,
// through src/fallback-iptables/apply.ts. The pod's netns cookie is recorded
// only to tell, at DEL, whether the path still names the same netns.
import type { Logger } from 'pino';
import { applyCapture, checkCapture, removeCapture, type IptablesOptions } from '../fallback-iptables/apply.js';
import { liveCookie, netnsCookie, netnsProblem } from '../pod-netns.js';
import type { PodBackend, PodSetup, RemoveOutcome } from './backend.js';

export class IptablesBackend implements PodBackend {
  readonly mode = 'iptables' as const;
  private readonly o: IptablesOptions;

  constructor(logger: Logger) {
    // apply/remove log one info line each; the CNI request line already says it.
    // (never louder than the parent: `meshcap status` passes a silent one)
    this.o = { logger: logger.child({ component: 'iptables' }, { level: logger.levelVal > 40 ? logger.level : 'warn' }) };
  }

  async register(p: PodSetup): Promise<bigint | null> {
    const cookie = await netnsCookie(p.netns).catch(() => null);
    await applyCapture(p.netns, p.config, this.o);
    return cookie;
  }

  async unregister(p: PodSetup, cookie: bigint | null): Promise<RemoveOutcome> {
    // The rules live in the netns: nothing to remove once it is gone, and
    // nothing of ours in another netns that now has the same path.
    const live = await liveCookie(p.netns);
    if (live === 'gone') return 'netns-gone';
    if (cookie !== null && live !== null && live !== cookie) return 'netns-replaced';
    await removeCapture(p.netns, p.config, this.o);
    return 'removed';
  }

  async check(p: PodSetup, cookie: bigint | null): Promise<string[]> {
    const gone = await netnsProblem(p.netns, cookie);
    if (gone) return [gone];
    return (await checkCapture(p.netns, p.config, this.o)).differences;
  }
}
