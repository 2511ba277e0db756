// meshcap explain's verdicts checked against the kernel: the pod's rendered
// rules are applied in a network namespace, each outbound connection is
// really attempted from the pod (as its uid), each inbound one from a client
// netns on the other end of the pod's eth0, and the nat rules whose packet
// counters moved (nat sees a connection's first packet only) must be exactly
// the rules explain names, in the same chains and places.
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { V1Pod } from '@kubernetes/client-node';
import { explainFlow, parseRestore, type Flow } from '../../../src/explain/explain.js';
import { renderIptables } from '../../../src/fallback-iptables/render.js';
import { podToCaptureConfig } from '../../../src/redirect/pod.js';
import { deleteNetns, inNs, makeNetns, sh } from '../fallback-iptables/netns.js';

const POD_IP = '198.18.40.5';
const CLIENT_IP = '198.18.40.6';
const pod: V1Pod = {
  kind: 'Pod',
  metadata: { name: 'web', annotations: {
    'sidecar.istio.io/status': '{}',
    'traffic.sidecar.istio.io/excludeOutboundIPRanges': '198.19.200.0/24',
    'traffic.sidecar.istio.io/excludeOutboundPorts': '5432',
    'traffic.sidecar.istio.io/excludeInboundPorts': '9000',
  } },
  spec: { containers: [{ name: 'app' }, { name: 'istio-proxy' }] },
  status: { podIPs: [{ ip: POD_IP }] },
};
const config = podToCaptureConfig(pod, 'istio', { enableIPv6: false });
const rules = renderIptables(config).v4;

let ns: { name: string; path: string };
let client: { name: string; path: string };
beforeAll(async () => {
  ns = await makeNetns('mc-explain');
  client = await makeNetns('mc-explain-cl');
  // The pod's eth0 leads to a client netns that owns CLIENT_IP only: an
  // outbound connection that is not redirected just times out (nobody
  // answers ARP for 198.19.x and nothing forwards), and the client's
  // connections to POD_IP are the inbound cases. No default route: only
  // 198.18.0.0/15 is reachable, inside these two namespaces.
  await inNs(ns.name, 'ip', ['link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth0-peer']);
  await inNs(ns.name, 'ip', ['link', 'set', 'eth0-peer', 'netns', client.name, 'name', 'eth0']);
  await inNs(ns.name, 'ip', ['addr', 'add', `${POD_IP}/24`, 'dev', 'eth0']);
  await inNs(ns.name, 'ip', ['link', 'set', 'eth0', 'up']);
  await inNs(ns.name, 'ip', ['route', 'add', '198.18.0.0/15', 'dev', 'eth0']);
  await inNs(client.name, 'ip', ['addr', 'add', `${CLIENT_IP}/24`, 'dev', 'eth0']);
  await inNs(client.name, 'ip', ['link', 'set', 'eth0', 'up']);
  await sh('ip', ['netns', 'exec', ns.name, 'iptables-restore'], rules);
});
afterAll(async () => {
  if (ns) await deleteNetns(ns.name);
  if (client) await deleteNetns(client.name);
});

/** The nat rules whose counters moved, as [chain, index in chain]. */
async function countedRules(): Promise<string[]> {
  const save = await inNs(ns.name, 'iptables-save', ['-c', '-t', 'nat']);
  const idx = new Map<string, number>();
  const out: string[] = [];
  for (const line of save.split('\n')) {
    const m = /^\[(\d+):\d+\] -A (\S+)/.exec(line);
    if (!m) continue;
    const i = idx.get(m[2]!) ?? 0;
    idx.set(m[2]!, i + 1);
    if (Number(m[1]) > 0) out.push(`${m[2]}#${i}`);
  }
  return out;
}

/** Where explain's rules are in the rendered chains, as [chain, index]. */
function explainedRules(trail: string[]): string[] {
  const nat = parseRestore(rules).get('nat')!;
  return trail.map((t) => {
    const chain = t.split(' ')[1]!;
    return `${chain}#${nat.get(chain)!.findIndex((r) => r.text === t)}`;
  });
}

async function attempt(flow: Flow): Promise<void> {
  await inNs(ns.name, 'iptables', ['-t', 'nat', '-Z']);
  const [from, to] = flow.direction === 'outbound' ? [ns.name, flow.peer] : [client.name, POD_IP];
  const py = `import socket\ns=socket.socket()\ns.settimeout(0.3)\ntry: s.connect((${JSON.stringify(to)}, ${flow.port}))\nexcept Exception: pass`;
  await execa('ip', ['netns', 'exec', from, 'setpriv', `--reuid=${flow.uid}`, `--regid=${flow.gid}`, '--clear-groups', '/usr/bin/python3', '-c', py], { reject: false });
}

const flows: [string, Partial<Flow>][] = [
  ['captured by default', { peer: '198.19.0.10', port: 443 }],
  ['excluded range', { peer: '198.19.200.7', port: 443 }],
  ['excluded port', { peer: '198.19.0.10', port: 5432 }],
  ['the proxy uid', { peer: '198.19.0.10', port: 443, uid: 1337, gid: 1337 }],
  ['loopback', { peer: '127.0.0.1', port: 8080 }],
  ['the pod\'s own address', { peer: POD_IP, port: 8080 }],
  ['the proxy to its own pod address', { peer: POD_IP, port: 8080, uid: 1337, gid: 1337 }],
  ['inbound to an app port', { direction: 'inbound', peer: CLIENT_IP, port: 8080 }],
  ['inbound to an excluded inbound port', { direction: 'inbound', peer: CLIENT_IP, port: 9000 }],
  ['inbound to the health port 15021', { direction: 'inbound', peer: CLIENT_IP, port: 15021 }],
  ['inbound to the sidecar\'s inbound port 15006', { direction: 'inbound', peer: CLIENT_IP, port: 15006 }],
];

describe('explain agrees with the kernel', () => {
  for (const [what, over] of flows) {
    it(what, async () => {
      const flow: Flow = { direction: 'outbound', peer: '', port: 0, protocol: 'tcp', uid: 1000, gid: 1000, podIPs: [POD_IP], ...over };
      const r = explainFlow(config, flow);
      await attempt(flow);
      // iptables-save lists chains in its own order: compare as sets
      expect((await countedRules()).sort(), `${what}: ${r.reason}`).toEqual(explainedRules(r.trail).sort());
    });
  }
});
