// The stdin/stdout JSON-lines protocol shared by the in-netns agents
// (ns-agent.mjs, istio-diff/fate-agent.mjs): one request per line
// {id, op, ...}, one reply per line {id, ok, result|error}; the agent exits
// when its stdin closes and announces itself with {ready, pid}.
import readline from 'node:readline';

const reply = (id, ok, x) => process.stdout.write(JSON.stringify(ok ? { id, ok, result: x } : { id, ok, error: String(x) }) + '\n');

export function serveOps(ops) {
  readline.createInterface({ input: process.stdin }).on('line', async (line) => {
    let msg;
    try { msg = JSON.parse(line); } catch { return; }
    const f = ops[msg.op];
    if (!f) return reply(msg.id, false, `unknown op ${msg.op}`);
    try { reply(msg.id, true, await f(msg)); } catch (e) { reply(msg.id, false, e.message); }
  }).on('close', () => process.exit(0));
  process.stdout.write(JSON.stringify({ ready: true, pid: process.pid }) + '\n');
}
