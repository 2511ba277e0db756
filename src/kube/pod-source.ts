// The seam between "where pods come from" (a file, the Kubernetes API) and the
// agent that decides and sets up redirection for them.
import type { V1Pod } from '@kubernetes/client-node';

export type PodEventType = 'ADDED' | 'MODIFIED' | 'DELETED';

export type PodChangeListener = (type: PodEventType, pod: V1Pod) => void;

export interface PodSource {
  /** Loads the initial state; resolves once the source is synced. */
  start(): Promise<void>;
  /** True once the initial state has been loaded. */
  synced(): boolean;
  get(namespace: string, name: string): V1Pod | undefined;
  /** Every pod currently known (for reconciliation). */
  list(): V1Pod[];
  /**
   * The pod, as soon as the source knows it, or undefined after timeoutMs.
   * A CNI ADD can arrive before the watch has delivered the pod.
   */
  waitFor(namespace: string, name: string, timeoutMs: number): Promise<V1Pod | undefined>;
  on(event: 'change', listener: PodChangeListener): this;
  off(event: 'change', listener: PodChangeListener): this;
  /** Stops following changes; pending waitFor calls resolve undefined. */
  stop(): Promise<void>;
}

/** Pods without a namespace live in "default", as kubectl would create them. */
export function podNamespace(pod: V1Pod): string {
  return pod.metadata?.namespace || 'default';
}

export function podKey(namespace: string, name: string): string {
  return `${namespace}/${name}`;
}
