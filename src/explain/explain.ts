// `meshcap explain --pod FILE`: what happens to one new connection of a pod,
// and which rule decided it. It renders the pod's rules exactly as the
// iptables fallback does (byte-identical to istio-iptables) and walks them
// the way netfilter walks a connection's first packet: outbound through nat
// OUTPUT, inbound through nat PREROUTING (REDIRECT) or mangle PREROUTING
// (TPROXY). The eBPF datapath implements the same rules (docs/datapath.md),
// so the verdict holds in both modes; what differs between the modes is in
// docs/datapath.md. A connection is new: no packet mark, no connmark,
// conntrack state NEW.
import { parseAddr, parseCidr } from '../redirect/cidr.js';
import type { CaptureConfig } from '../redirect/config.js';
import { renderIptables } from '../fallback-iptables/render.js';

export interface Flow {
  direction: 'outbound' | 'inbound';
  /** Destination address (outbound) / the peer's address (inbound). */
  peer: string;
  port: number;
  protocol: 'tcp' | 'udp';
  /** The process's uid/gid (outbound). */
  uid: number;
  gid: number;
  /** Outbound: the pod's own addresses (a connection to one of them leaves via lo). */
  podIPs: readonly string[];
}

export interface Explanation {
  verdict: 'captured' | 'not captured' | 'dropped';
  /** The port the sidecar receives it on, when captured. */
  toPort?: number;
  /** The rule that decided, as rendered, or null when no rule did (the chain policy). */
  rule: string | null;
  /** Chains walked, in order. */
  path: string[];
  /** The rules that matched, in order: the jumps, then the one that decided. */
  trail: string[];
  /** One sentence. */
  reason: string;
}

interface Rule { text: string; args: string[] }
type Tables = Map<string, Map<string, Rule[]>>;

export function parseRestore(text: string): Tables {
  const tables: Tables = new Map();
  let chains: Map<string, Rule[]> | undefined;
  for (const line of text.split('\n')) {
    if (line.startsWith('*')) {
      chains = new Map();
      tables.set(line.slice(1).trim(), chains);
    } else if (chains && (line.startsWith('-A ') || line.startsWith('-I '))) {
      const args = line.split(/\s+/);
      const chain = args[1]!;
      const list = chains.get(chain) ?? [];
      chains.set(chain, list);
      if (args[0] === '-A') list.push({ text: line, args: args.slice(2) });
      else {
        const pos = /^\d+$/.test(args[2] ?? '') ? Number(args[2]) : 1;
        list.splice(pos - 1, 0, { text: line, args: args.slice(/^\d+$/.test(args[2] ?? '') ? 3 : 2) });
      }
    }
  }
  return tables;
}

interface Packet { src: string; dst: string; dport: number; protocol: 'tcp' | 'udp'; oif?: string; iif?: string; uid?: number; gid?: number }

function inCidr(addr: string, cidr: string): boolean {
  const a = parseAddr(addr);
  let c;
  try {
    c = parseCidr(cidr.includes('/') ? cidr : `${cidr}/${addr.includes(':') ? 128 : 32}`);
  } catch {
    return false;
  }
  if (!a || a.family !== c.family) return false;
  const bytes = a.bytes;
  const net = c.bytes;
  for (let bit = 0; bit < c.prefix; bit++) {
    const i = bit >> 3;
    const m = 0x80 >> (bit & 7);
    if ((bytes[i]! & m) !== (net[i]! & m)) return false;
  }
  return true;
}

function portIn(spec: string, port: number): boolean {
  return spec.split(',').some((p) => {
    const [lo, hi] = p.split(':').map(Number);
    return hi === undefined ? port === lo : port >= lo! && port <= hi;
  });
}

/** Does the rule's match part hold for this packet? Returns the target args on a match. */
function matches(args: string[], p: Packet): string[] | null {
  let i = 0;
  let neg = false;
  const test = (ok: boolean) => (neg ? !ok : ok);
  while (i < args.length) {
    const a = args[i]!;
    if (a === '!') { neg = true; i++; continue; }
    if (a === '-j') return args.slice(i + 1);
    const v = args[i + 1] ?? '';
    let ok: boolean;
    switch (a) {
      case '-p': ok = test(v === p.protocol); i += 2; break;
      case '-o': ok = test(p.oif === v); i += 2; break;
      case '-i': ok = test(p.iif === v); i += 2; break;
      case '-d': ok = test(inCidr(p.dst, v)); i += 2; break;
      case '-s': ok = test(inCidr(p.src, v)); i += 2; break;
      case '--dport': case '--dports': ok = test(portIn(v, p.dport)); i += 2; break;
      case '--sport': ok = test(false); i += 2; break; // replies only: a new connection's source port is ephemeral
      case '--uid-owner': ok = test(p.uid !== undefined && String(p.uid) === v); i += 2; break;
      case '--gid-owner': ok = test(p.gid !== undefined && String(p.gid) === v); i += 2; break;
      case '--mark': ok = test(/^0(x0+)?(\/|$)/.test(v)); i += 2; break; // a new connection: mark 0
      case '--ctstate': ok = test(v.split(',').includes('NEW')); i += 2; break;
      case '-m': i += 2; continue; // the module's options follow
      default: ok = true; i += 1; // unknown match words are not in Istio's rules
    }
    neg = false;
    if (!ok) return null;
  }
  return null;
}

function walk(tables: Tables, table: string, chain: string, p: Packet): Omit<Explanation, 'reason'> {
  const chains = tables.get(table) ?? new Map<string, Rule[]>();
  const path: string[] = [];
  const trail: string[] = [];
  const run = (name: string, depth: number): Omit<Explanation, 'reason' | 'path' | 'trail'> | 'return' => {
    path.push(`${table} ${name}`);
    for (const rule of chains.get(name) ?? []) {
      const target = matches(rule.args, p);
      if (!target) continue;
      const t = target[0]!;
      trail.push(rule.text);
      if (t === 'RETURN') return { verdict: 'not captured', rule: rule.text };
      if (t === 'REDIRECT') {
        const at = target.findIndex((x) => x === '--to-ports' || x === '--to-port');
        return { verdict: 'captured', toPort: Number(target[at + 1]), rule: rule.text };
      }
      if (t === 'TPROXY') return { verdict: 'captured', toPort: Number(target[target.indexOf('--on-port') + 1]), rule: rule.text };
      if (t === 'DROP') return { verdict: 'dropped', rule: rule.text };
      if (t === 'ACCEPT') return { verdict: 'not captured', rule: rule.text };
      if (chains.has(t) && depth < 16) {
        const r = run(t, depth + 1);
        if (r !== 'return') return r;
        continue;
      }
      trail.pop(); // MARK, CONNMARK, CT: not terminating, decide nothing
    }
    return 'return';
  };
  const r = run(chain, 0);
  return r === 'return' ? { verdict: 'not captured', rule: null, path, trail } : { ...r, path, trail };
}

/** The verdict for one flow of a pod whose capture config is `config`. */
export function explainFlow(config: CaptureConfig, flow: Flow): Explanation {
  const out = renderIptables(config);
  return explainFlowInRules(flow.peer.includes(':') ? out.v6 ?? '' : out.v4, config.parsed.tproxy, flow);
}

/**
 * The verdict for one flow against rules in iptables-save form: the rendered
 * ones, or the ones live in a pod's netns (iptables mode), so explain can
 * say what the kernel holds, not only what it should hold.
 */
export function explainFlowInRules(text: string, tproxy: boolean, flow: Flow): Explanation {
  const family = flow.peer.includes(':') ? 6 : 4;
  const tables = parseRestore(text);
  const loopback = family === 6 ? '::1' : '127.0.0.1';
  if (flow.direction === 'outbound') {
    const local = flow.podIPs.includes(flow.peer) || inCidr(flow.peer, family === 6 ? '::1/128' : '127.0.0.0/8');
    const p: Packet = {
      src: local ? (inCidr(flow.peer, family === 6 ? '::1/128' : '127.0.0.0/8') ? loopback : flow.peer) : flow.podIPs.find((a) => a.includes(':') === (family === 6)) ?? (family === 6 ? '2001:db8::1' : '10.0.0.1'),
      dst: flow.peer, dport: flow.port, protocol: flow.protocol, oif: local ? 'lo' : 'eth0', uid: flow.uid, gid: flow.gid,
    };
    const r = walk(tables, 'nat', 'OUTPUT', p);
    return { ...r, reason: reason(r, `${flow.protocol} ${flow.peer}:${flow.port} from uid ${flow.uid} gid ${flow.gid}${local ? ' (leaves via lo: one of the pod\'s own addresses or loopback)' : ''}`) };
  }
  const self = flow.podIPs.find((a) => a.includes(':') === (family === 6)) ?? (family === 6 ? '2001:db8::1' : '10.0.0.1');
  const p: Packet = { src: flow.peer, dst: self, dport: flow.port, protocol: flow.protocol, iif: 'eth0' };
  const table = tproxy ? 'mangle' : 'nat';
  const r = walk(tables, table, 'PREROUTING', p);
  return { ...r, reason: reason(r, `inbound ${flow.protocol} from ${flow.peer} to port ${flow.port}`) };
}

function reason(r: Omit<Explanation, 'reason'>, what: string): string {
  const why = r.trail.map((t) => `\n    ${t}`).join('');
  if (r.verdict === 'captured') return `${what}: CAPTURED, the sidecar receives it on port ${r.toPort}; the rules that decided:${why}`;
  if (r.verdict === 'dropped') return `${what}: DROPPED by:${why}`;
  return r.rule ? `${what}: NOT captured (goes directly); the rules that decided:${why}` : `${what}: NOT captured: no rule matches it (${r.path.join(' -> ')})`;
}
