// The sandbox's application processes, run inside the pods:
//   node dist/sandbox/workload.js server --ports 8080,9090
//   node dist/sandbox/workload.js client --targets IP:PORT,IP:PORT --count N --interval-ms MS
// The server answers one line per connection. The client makes exactly
// `count` connections (bounded, one at a time, round-robin over the targets),
// each timed from connect() to the server's answer, and prints one JSON line
// per connection, then a summary.
import net from 'node:net';
import { parseArgs } from 'node:util';

export interface ConnEvent {
  event: 'conn';
  target: string;
  ok: boolean;
  ms: number;
  /** the server's answer: the port it was reached on and the peer it saw */
  reply?: string;
  error?: string;
}

const out = (o: object) => process.stdout.write(JSON.stringify(o) + '\n');

export function hostPort(s: string): { host: string; port: number } {
  const m = /^(.+):(\d+)$/.exec(s);
  const port = m ? Number(m[2]) : NaN;
  if (!m || !(port > 0 && port < 65536)) throw new Error(`target ${s} is not HOST:PORT`);
  return { host: m[1]!.replace(/^\[|\]$/g, ''), port };
}

async function server(ports: number[]): Promise<void> {
  await Promise.all(
    ports.map(
      (port) =>
        new Promise<void>((resolve, reject) => {
          const s = net.createServer((sock) => {
            const peer = `${sock.remoteAddress}:${sock.remotePort}`;
            sock.on('error', () => sock.destroy());
            sock.end(`port=${port} peer=${peer}\n`);
            out({ event: 'served', port, peer });
          });
          s.once('error', reject);
          s.listen({ host: '0.0.0.0', port, backlog: 1024 }, () => resolve());
        }),
    ),
  );
  out({ event: 'ready', ports });
  const stop = () => process.exit(0);
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

function once(target: string, timeoutMs: number): Promise<ConnEvent> {
  const { host, port } = hostPort(target);
  const t0 = performance.now();
  return new Promise((resolve) => {
    let reply = '';
    let settled = false;
    const finish = (ok: boolean, error?: string) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      sock.destroy();
      const ms = Math.round((performance.now() - t0) * 1000) / 1000;
      resolve({ event: 'conn', target, ok, ms, ...(ok ? { reply: reply.trim() } : {}), ...(error ? { error } : {}) });
    };
    const sock = net.connect({ host, port, noDelay: true });
    const timer = setTimeout(() => finish(false, `no answer within ${timeoutMs} ms`), timeoutMs);
    sock.on('data', (d) => {
      reply += d.toString();
      if (reply.includes('\n')) finish(true);
    });
    sock.on('end', () => finish(reply.length > 0, reply.length > 0 ? undefined : 'closed without an answer'));
    sock.on('error', (e) => finish(false, e.message));
  });
}

async function client(targets: string[], count: number, intervalMs: number, timeoutMs: number): Promise<void> {
  for (const t of targets) hostPort(t);
  let ok = 0;
  for (let i = 0; i < count; i++) {
    const start = performance.now();
    const e = await once(targets[i % targets.length]!, timeoutMs);
    if (e.ok) ok++;
    out(e);
    const wait = intervalMs - (performance.now() - start);
    if (wait > 0 && i + 1 < count) await new Promise((r) => setTimeout(r, wait));
  }
  out({ event: 'done', sent: count, ok });
}

async function main(argv: string[]): Promise<void> {
  const [role, ...rest] = argv;
  const { values } = parseArgs({
    args: rest,
    options: {
      ports: { type: 'string', default: '8080' },
      targets: { type: 'string', default: '' },
      count: { type: 'string', default: '10' },
      'interval-ms': { type: 'string', default: '100' },
      'timeout-ms': { type: 'string', default: '3000' },
    },
  });
  if (role === 'server') return server(values.ports!.split(',').map(Number));
  if (role === 'client') {
    const count = Number(values.count);
    if (!Number.isInteger(count) || count < 1 || count > 100_000) throw new Error(`--count ${values.count}: 1..100000`);
    return client(values.targets!.split(',').filter(Boolean), count, Number(values['interval-ms']), Number(values['timeout-ms']));
  }
  throw new Error('usage: workload.js server --ports P,P | client --targets H:P,H:P --count N --interval-ms MS');
}

// Run only as a program, not when imported (the parser is unit-tested).
if (import.meta.url === `file://${process.argv[1]}`) {
  main(process.argv.slice(2)).catch((e: Error) => {
    process.stderr.write(`workload: ${e.message}\n`);
    process.exit(1);
  });
}
