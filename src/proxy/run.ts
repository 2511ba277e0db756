// The reference proxy as a process (`meshcap proxy`): starts it, prints one
// JSON line when it listens ({"event":"ready"}, which the sandbox and the
// tests wait for) and one with its counters when SIGTERM or SIGINT stops it.
import { startReferenceProxy, type ProxyOptions } from './reference-proxy.js';

export async function runReferenceProxy(opts: ProxyOptions): Promise<void> {
  const p = startReferenceProxy(opts);
  await p.ready;
  process.stdout.write(JSON.stringify({ event: 'ready', pid: process.pid, uid: process.getuid?.() }) + '\n');
  const stop = () => {
    p.close();
    process.stdout.write(JSON.stringify({ event: 'stats', ...p.stats }) + '\n');
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}
