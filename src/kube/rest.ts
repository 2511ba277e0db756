// The handful of Kubernetes REST calls the node's processes make besides their
// watches (a LIST page, an Event, a label patch, a delete with a UID
// precondition, a node taint patch, a DaemonSet read), sent the way
// client-node's Watch sends its request: the URL from the kubeconfig's current
// cluster, credentials, TLS and proxy from KubeConfig.applyToFetchOptions,
// node-fetch. The answers are plain JSON, as the API server sends them (no
// model classes: src/kube/client-node-entry.mjs says why).
import type { Headers } from 'node-fetch';
import { fetch, type KubeConfig } from './client-node.js';

/** A non-2xx answer: the HTTP status (as `code`, like client-node's ApiException) and the Status message. */
export class KubeApiError extends Error {
  readonly code: number;
  constructor(method: string, path: string, code: number, message: string) {
    super(`${method} ${path}: ${message}`);
    this.name = 'KubeApiError';
    this.code = code;
  }
}

export interface KubeRequest {
  method?: 'GET' | 'POST' | 'PATCH' | 'DELETE';
  /** Query parameters; undefined values are left out. */
  query?: Record<string, string | number | boolean | undefined>;
  body?: unknown;
  /** The body's media type (default application/json; a patch names its strategy). */
  contentType?: string;
  /**
   * Gives up after this long (default 90 s: the API server ends a request that
   * is not a watch after 60 s, so a request older than that sits on a dead
   * connection).
   */
  timeoutMs?: number;
  /** Aborts the request (the caller is stopping). */
  signal?: AbortSignal;
}

/** Sends one request to the kubeconfig's current cluster; resolves with the answer's JSON. */
export async function kubeRequest<T = unknown>(kc: KubeConfig, path: string, req: KubeRequest = {}): Promise<T> {
  const method = req.method ?? 'GET';
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new Error('the kubeconfig has no current cluster');
  // cluster.server may carry a path prefix (a proxy's): keep it
  const url = new URL(cluster.server.replace(/\/+$/, '') + path);
  for (const [k, v] of Object.entries(req.query ?? {})) if (v !== undefined) url.searchParams.set(k, String(v));
  const init = await kc.applyToFetchOptions({});
  init.method = method;
  init.timeout = req.timeoutMs ?? 90_000;
  if (req.signal) init.signal = req.signal as NonNullable<typeof init.signal>;
  const headers = init.headers as Headers; // applyToFetchOptions always builds one
  headers.set('Accept', 'application/json');
  if (req.body !== undefined) {
    headers.set('Content-Type', req.contentType ?? 'application/json');
    init.body = JSON.stringify(req.body);
  }
  let res: Awaited<ReturnType<typeof fetch>>;
  let text: string;
  try {
    res = await fetch(url, init);
    text = await res.text();
  } catch (err) {
    // which request failed, then node-fetch's reason (a timeout, ECONNREFUSED, an
    // abort); its code (ECONNREFUSED) stays on the cause, where describe() looks
    throw new Error(`${method} ${path}: ${(err as Error).message}`, { cause: err });
  }
  if (res.status < 200 || res.status > 299) {
    let message = text.slice(0, 500) || res.statusText;
    try {
      const status = JSON.parse(text) as { message?: unknown };
      if (typeof status.message === 'string') message = status.message;
    } catch { /* not a Status: keep the text */ }
    throw new KubeApiError(method, path, res.status, `HTTP ${res.status}: ${message}`);
  }
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new Error(`${method} ${path}: the API server's answer (HTTP ${res.status}) is not JSON: ${text.slice(0, 200)}`);
  }
}
