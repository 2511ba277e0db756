// Real traffic through the rendered rules: an app in a test netns connects to
// 198.18.0.2:80 (a server in a second test netns, reached over a veth pair, no
// default route anywhere) and lands on the "proxy" listener on 15001, which
// reads the original destination with SO_ORIGINAL_DST like Envoy. Inbound
// connections go to 15006 except excluded ports. Every process is bounded by
// a timeout and killed in finally; both namespaces are deleted in afterAll.
import { fileURLToPath } from 'node:url';
import { execa, type ResultPromise } from 'execa';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseIstioIptablesArgs } from '../../../src/redirect/flags.js';
import { applyCapture, removeCapture } from '../../../src/fallback-iptables/apply.js';
import { deleteNetns, hostRules, inNs, makeNetns, sh } from './netns.js';

const LISTENER = fileURLToPath(new URL('./origdst_listener.py', import.meta.url));
const opts = { lockDir: `/tmp/meshcap-test-xtables-${process.pid}`, logger: pino({ level: 'silent' }) };
const config = parseIstioIptablesArgs(
  ['-p', '15001', '-z', '15006', '-u', '1337', '-g', '1337', '-m', 'REDIRECT', '-i', '*', '-b', '*', '-d', '8081'],
  { lookupUser: () => undefined },
).config;

let app: { name: string; path: string } | undefined;
let server: { name: string; path: string } | undefined;
const procs: ResultPromise[] = [];
let hostBefore = '';

function spawnIn(ns: string, cmd: string[]): ResultPromise {
  const p = execa('ip', ['netns', 'exec', ns, ...cmd], { timeout: 60_000, reject: false });
  procs.push(p);
  return p;
}

async function waitListening(ns: string, port: number): Promise<void> {
  for (let i = 0; i < 100; i++) {
    if ((await inNs(ns, 'ss', ['-ltnH'])).split('\n').some((l) => l.includes(`:${port} `))) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`nothing listening on ${port} in netns ${ns} after 5s`);
}

async function connect(ns: string, dst: string, asUid?: number): Promise<string> {
  const client = ['socat', '-T', '5', 'STDIO', `TCP:${dst},connect-timeout=5`];
  const argv = asUid === undefined ? client : ['setpriv', `--reuid=${asUid}`, `--regid=${asUid}`, '--clear-groups', ...client];
  const r = await execa('ip', ['netns', 'exec', ns, ...argv], { input: '', timeout: 15_000, reject: false });
  return `${r.stdout}${r.exitCode === 0 ? '' : ` [exit ${r.exitCode}: ${r.stderr}]`}`.trim();
}

beforeAll(async () => {
  expect(process.getuid?.()).toBe(0);
  hostBefore = await hostRules();
  app = await makeNetns('mc-app');
  server = await makeNetns('mc-srv');
  // The veth pair is created inside the app netns with its peer in the server netns: never on the host.
  await sh('ip', ['-n', app.name, 'link', 'add', 'va', 'type', 'veth', 'peer', 'name', 'vb', 'netns', server.name]);
  await sh('ip', ['-n', app.name, 'addr', 'add', '198.18.0.1/24', 'dev', 'va']);
  await sh('ip', ['-n', server.name, 'addr', 'add', '198.18.0.2/24', 'dev', 'vb']);
  await sh('ip', ['-n', app.name, 'link', 'set', 'va', 'up']);
  await sh('ip', ['-n', server.name, 'link', 'set', 'vb', 'up']);
});

afterAll(async () => {
  for (const p of procs) p.kill('SIGKILL');
  await Promise.allSettled(procs);
  if (app) await deleteNetns(app.name);
  if (server) await deleteNetns(server.name);
  await execa('rm', ['-rf', opts.lockDir], { reject: false });
  expect(await hostRules()).toBe(hostBefore);
});

describe('REDIRECT capture with real connections', () => {
  it('redirects outbound to 15001 and inbound to 15006 with SO_ORIGINAL_DST intact; honours exclusions', async () => {
    try {
      await applyCapture(app!.path, config, opts);
      spawnIn(app!.name, ['python3', LISTENER, '15001', '1', '20']);
      spawnIn(app!.name, ['python3', LISTENER, '15006', '1', '20']);
      spawnIn(app!.name, ['socat', '-T', '5', 'TCP-LISTEN:8081,reuseaddr', 'SYSTEM:echo APP8081']);
      spawnIn(server!.name, ['socat', '-T', '5', 'TCP-LISTEN:80,bind=198.18.0.2,reuseaddr', 'SYSTEM:echo SERVER']);
      for (const [ns, port] of [[app!.name, 15001], [app!.name, 15006], [app!.name, 8081], [server!.name, 80]] as const) {
        await waitListening(ns, port);
      }

      // App (uid 0) -> 198.18.0.2:80 is captured by the outbound proxy port.
      expect(await connect(app!.name, '198.18.0.2:80')).toBe('ORIG 198.18.0.2:80 VIA 15001');
      // The proxy's own uid goes straight out to the real server.
      expect(await connect(app!.name, '198.18.0.2:80', 1337)).toBe('SERVER');
      // Inbound to any port lands on 15006 with the original port recoverable...
      expect(await connect(server!.name, '198.18.0.1:8080')).toBe('ORIG 198.18.0.1:8080 VIA 15006');
      // ...except the excluded port, which reaches the app directly.
      expect(await connect(server!.name, '198.18.0.1:8081')).toBe('APP8081');
    } finally {
      await removeCapture(app!.path, config, opts);
    }
  });
});
