// The agent's HTTP endpoint: /healthz (the process serves), /readyz (datapath
// loaded and pod source synced), /metrics (Prometheus text).
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';

export interface HttpEndpoint {
  address: AddressInfo;
  close(): Promise<void>;
}

/** "HOST:PORT", "[v6]:PORT" or ":PORT" (all addresses). */
export function parseListenAddress(s: string): { host: string | undefined; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d{1,5})$/.exec(s);
  const port = m ? Number(m[3]) : NaN;
  if (!m || port > 65535) throw new Error(`--metrics-addr ${JSON.stringify(s)} is not HOST:PORT (e.g. 127.0.0.1:15014, :15014)`);
  const host = m[1] ?? m[2];
  return { host: host === '' ? undefined : host, port };
}

export async function startHttpEndpoint(addr: string, registry: Registry, notReady: () => string | undefined): Promise<HttpEndpoint> {
  const { host, port } = parseListenAddress(addr);
  const server = http.createServer((req, res) => {
    const url = (req.url ?? '/').split('?')[0];
    const send = (code: number, body: string, type = 'text/plain; charset=utf-8') => {
      res.writeHead(code, { 'content-type': type });
      res.end(body);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return send(405, 'method not allowed\n');
    if (url === '/healthz') return send(200, 'ok\n');
    if (url === '/readyz') {
      const why = notReady();
      return why ? send(503, `not ready: ${why}\n`) : send(200, 'ready\n');
    }
    if (url === '/metrics') {
      registry.metrics().then(
        (text) => send(200, text, registry.contentType),
        (err: Error) => send(500, `metrics failed: ${err.message}\n`),
      );
      return;
    }
    send(404, 'not found (try /healthz, /readyz, /metrics)\n');
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err) => reject(new Error(`cannot listen on --metrics-addr ${addr}: ${err.message}`)));
    server.listen(port, host, () => resolve());
  });
  return {
    address: server.address() as AddressInfo,
    close: () => new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}
