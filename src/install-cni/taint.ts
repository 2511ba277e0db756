// Optional: a node taint (registered by the kubelet, e.g.
// --register-with-taints=meshcap.io/not-ready=:NoSchedule) that keeps pods off
// a new node until meshcap can capture them there, removed once both halves
// are ready: meshcap-cni is last in the runtime's config (install-cni) and the
// agent serves (its /readyz, on the same host network). Istio's taint
// controller does the same for istio-cni. Only the taint with this key is
// removed; a JSON patch with a `test` of the whole list makes a concurrent
// change of the node's taints fail the patch instead of being overwritten
// (then it is simply tried again).
import type { KubeConfig, V1Node, V1Taint } from '@kubernetes/client-node';
import type { Logger } from 'pino';

/** The node's taints without `key` (pure); null when it has none with that key. */
export function withoutTaint(taints: readonly V1Taint[] | undefined, key: string): V1Taint[] | null {
  const list = taints ?? [];
  if (!list.some((t) => t.key === key)) return null;
  return list.filter((t) => t.key !== key);
}

export interface TaintRemoverOptions {
  kubeConfig: KubeConfig;
  nodeName: string;
  key: string;
  /** Both halves ready? */
  ready(): Promise<boolean>;
  logger: Logger;
  intervalMs?: number;
}

/** Polls readiness; once ready, removes the taint (once per process; a re-added taint is removed again on the next pass). */
export class TaintRemover {
  private timer: NodeJS.Timeout | undefined;
  private busy = false;

  constructor(private readonly o: TaintRemoverOptions) {}

  start(): void {
    const tick = () => {
      if (this.busy) return;
      this.busy = true;
      this.pass().catch((err: unknown) => this.o.logger.warn({ node: this.o.nodeName, taint: this.o.key, err: (err as Error).message }, 'cannot remove the node taint; retrying'))
        .finally(() => {
          this.busy = false;
        });
    };
    this.timer = setInterval(tick, this.o.intervalMs ?? 2000);
    this.timer.unref();
    tick();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
  }

  /** One pass: true when the node has no such taint (any more). */
  async pass(): Promise<boolean> {
    if (!(await this.o.ready())) return false;
    const { kubeRequest } = await import('../kube/rest.js');
    const nodePath = `/api/v1/nodes/${encodeURIComponent(this.o.nodeName)}`;
    const node = await kubeRequest<V1Node>(this.o.kubeConfig, nodePath);
    const taints = node.spec?.taints ?? [];
    const left = withoutTaint(taints, this.o.key);
    if (left === null) return true;
    // the test op makes the patch fail (422) if the taints changed since the read
    await kubeRequest(this.o.kubeConfig, nodePath, {
      method: 'PATCH',
      contentType: 'application/json-patch+json',
      body: [
        { op: 'test', path: '/spec/taints', value: taints },
        { op: 'replace', path: '/spec/taints', value: left },
      ],
    });
    this.o.logger.info({ node: this.o.nodeName, taint: this.o.key }, 'meshcap is ready on this node: node taint removed');
    return true;
  }
}

/** The agent's /readyz answers 200. */
export async function agentReady(url: string): Promise<boolean> {
  try {
    const r = await fetch(url, { signal: AbortSignal.timeout(2000) });
    return r.status === 200;
  } catch {
    return false;
  }
}
