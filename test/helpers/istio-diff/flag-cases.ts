// Generated istio-iptables invocations (fast-check): every flag and
// environment variable meshcap's `iptables render` takes, in every pflag
// spelling, with valid, odd and invalid values, run in a v4, v6 or dual-stack
// namespace, with a resolv.conf when DNS servers matter.
import fc from 'fast-check';
import { ISTIO_IPTABLES_FLAGS, envName } from '../../../src/redirect/flags.js';
import type { Family } from '../istio-peers.js';

export interface FlagCase {
  args: string[];
  env: Record<string, string>;
  family: Family;
  /** nameserver lines of /etc/resolv.conf (read only with --redirect-dns and without --capture-all-dns). */
  nameservers: string[];
}

const port = fc.oneof(
  { weight: 3, arbitrary: fc.constantFrom('15001', '15006', '15008', '15020', '80', '8080', '443', '53') },
  { weight: 2, arbitrary: fc.integer({ min: 0, max: 65535 }).map(String) },
  { weight: 1, arbitrary: fc.constantFrom('65536', '-1', 'abc', '', ' 80', '0x50', '80 ') },
);
const portList = fc.oneof(
  { weight: 2, arbitrary: fc.constantFrom('*', '') },
  { weight: 4, arbitrary: fc.array(fc.oneof({ weight: 6, arbitrary: fc.integer({ min: 1, max: 65535 }).map(String) }, { weight: 1, arbitrary: port }), { minLength: 1, maxLength: 4 }).map((a) => a.join(',')) },
  { weight: 1, arbitrary: fc.constantFrom('80,,443', '80,', ',80', '8000-8010', '8000:8010', '80,*', '15090,15021,15020', '80, 443') },
);
const ids = fc.constantFrom('1337', '0', '1337,1338', '', 'abc', '4294967295', '4294967296', '-1', '1337,', '1000', '65534');
const cidr = fc.constantFrom(
  '10.0.0.0/8', '10.1.2.3/8', '192.168.0.0/16', '0.0.0.0/0', '127.0.0.1/32', '127.0.0.0/8', '198.18.0.0/15',
  '::1/128', '2001:db8::/32', '2001:DB8::1/64', '::/0', 'fd00::/8', '::ffff:10.0.0.1/128', '10.0.0.1/32',
  '1.2.3.4', '300.0.0.0/8', '10.0.0.0/33', '2001:db8::/129', 'abc', '10.0.0.0/08', ' 10.0.0.0/8',
);
const cidrList = fc.oneof(
  { weight: 2, arbitrary: fc.constantFrom('*', '') },
  { weight: 5, arbitrary: fc.array(cidr, { minLength: 1, maxLength: 4 }).map((a) => a.join(',')) },
);
const ifaces = fc.constantFrom('eth1', 'eth0,eth1', '', 'veth-1.2', 'averyveryverylongname', 'bad/name', 'bad name', 'eth0,', 'net1,net2,net3', 'eth\u00e9');
const mode = fc.constantFrom('REDIRECT', 'TPROXY', '', 'redirect', 'NONE', 'tproxy');
const mark = fc.constantFrom('1337', '0', '0x539', 'abc', '4294967295', '-1', '1338');
const table = fc.constantFrom('133', '0', 'abc', '255', '300', '1');
const boolValue = fc.constantFrom('true', 'false', '1', '0', 't', 'F', 'TRUE', 'True', 'yes', '', 'on');
const duration = fc.constantFrom('5s', '1m', '100ms', 'abc', '10', '0', '1h30m', '-1s');
const netnsPath = fc.constantFrom('/var/run/netns/x', '', 'relative');
const iptablesBinary = fc.constantFrom('', 'legacy', 'nft', 'iptables', 'iptables-nft', 'bogus');
const groups = fc.oneof(
  fc.constantFrom('*', '', 'g1', '1000,1001', 'java,python', '1000,', ' 1000'),
  fc.integer({ min: 60, max: 70 }).map((n) => Array.from({ length: n }, (_, i) => String(1000 + i)).join(',')),
);
const loopbackCidr = fc.constantFrom('127.0.0.1/32', '127.0.0.0/8', '127.1.0.0/16', '10.0.0.0/8', '127.0.0.1/7', 'abc', '::1/128', '127.0.0.10/32');
const envoyUser = fc.constantFrom('root', 'nobody', 'istio-proxy', 'nosuchuser', '');
const nameserver = fc.constantFrom('198.18.0.53', '198.19.255.1', '2001:db8::53', '2001:db8:1::1', '8.8.8.8', 'not-an-ip');

/** Values for a flag, by its long name. */
function valueFor(long: string): fc.Arbitrary<string> {
  switch (long) {
    case 'envoy-port': case 'inbound-capture-port': case 'inbound-tunnel-port': case 'iptables-probe-port': return port;
    case 'proxy-uid': case 'proxy-gid': return ids;
    case 'istio-inbound-interception-mode': return mode;
    case 'istio-inbound-ports': case 'istio-local-exclude-ports': case 'istio-outbound-ports': case 'istio-local-outbound-ports-exclude': return portList;
    case 'istio-exclude-interfaces': case 'kube-virt-interfaces': return ifaces;
    case 'istio-service-cidr': case 'istio-service-exclude-cidr': return cidrList;
    case 'istio-inbound-tproxy-mark': return mark;
    case 'istio-inbound-tproxy-route-table': return table;
    case 'probe-timeout': return duration;
    case 'network-namespace': return netnsPath;
    case 'force-iptables-binary': return iptablesBinary;
    default: return boolValue;
  }
}

/**
 * Flags not generated, each for a reason: the harness passes --dry-run itself;
 * --run-validation starts a probe listener and waits (no rules change);
 * --native-nftables makes istio-iptables print nftables, which meshcap does
 * not render (it refuses the flag: docs/istio-compat.md).
 */
export const NOT_GENERATED = new Set(['dry-run', 'run-validation', 'native-nftables']);
const FLAGS = ISTIO_IPTABLES_FLAGS.filter((d) => !NOT_GENERATED.has(d.long));

/** One flag occurrence in one of pflag's spellings. */
const flagArg = fc.constantFrom(...FLAGS).chain((def) =>
  fc.tuple(valueFor(def.long), fc.integer({ min: 0, max: 4 })).map(([v, style]): string[] => {
    if (def.kind === 'bool') {
      if (style < 2) return def.short ? [style === 0 ? `-${def.short}` : `--${def.long}`] : [`--${def.long}`];
      return [def.short && style === 2 ? `-${def.short}=${v}` : `--${def.long}=${v}`];
    }
    if (def.short && style === 0) return [`-${def.short}`, v];
    if (def.short && style === 1 && v !== '' && !v.startsWith('=')) return [`-${def.short}${v}`];
    if (def.short && style === 2) return [`-${def.short}=${v}`];
    if (style === 3) return [`--${def.long}`, v];
    return [`--${def.long}=${v}`];
  }),
);

/** Environment variables istio-iptables reads (flag.BindEnv names, aliases, env-only settings). */
const ENV_VARS: Array<[string, fc.Arbitrary<string>]> = [
  ...FLAGS.filter((d) => d.env).map((d): [string, fc.Arbitrary<string>] => [envName(d.long), valueFor(d.long)]),
  ...FLAGS.flatMap((d) => (d.aliases ?? []).map((a): [string, fc.Arbitrary<string>] => [a, valueFor(d.long)])),
  ['ISTIO_OUTBOUND_OWNER_GROUPS', groups],
  ['ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE', groups],
  ['ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR', loopbackCidr],
  ['ENVOY_USER', envoyUser],
  // envoy-port is flag.Bind, not BindEnv: this must change nothing
  ['ENVOY_PORT', port],
];

const envArb = fc.subarray(ENV_VARS, { maxLength: 5 }).chain((vars) =>
  vars.length === 0 ? fc.constant({}) : fc.tuple(...vars.map(([, arb]) => arb)).map((values) =>
    Object.fromEntries(vars.map(([name], i) => [name, values[i] as string]))),
);

/** A typical sidecar command line, so most cases render real rule sets, not just the defaults. */
const typical = fc.constantFrom<string[]>(
  [],
  ['-p', '15001', '-z', '15006', '-u', '1337', '-m', 'REDIRECT', '-i', '*', '-x', '', '-b', '*', '-d', '15090,15021,15020'],
  ['-p', '15001', '-z', '15006', '-u', '1337', '-m', 'TPROXY', '-i', '*', '-b', '*'],
  ['-i', '*', '-b', '*', '--redirect-dns', '--capture-all-dns'],
  ['-i', '10.0.0.0/8,2001:db8::/32', '-b', '80,443', '--redirect-dns'],
);

export const flagCase: fc.Arbitrary<FlagCase> = fc.record({
  base: typical,
  extra: fc.array(flagArg, { maxLength: 8 }),
  env: envArb,
  family: fc.constantFrom<Family>('v4', 'v6', 'dual'),
  nameservers: fc.array(nameserver, { maxLength: 3 }),
}).map(({ base, extra, env, family, nameservers }) => ({ args: [...base, ...extra.flat()], env, family, nameservers }));

/** The resolv.conf a case's istio-iptables reads. */
export function resolvConf(c: FlagCase): string {
  return `# generated by meshcap's istio differential test\n${c.nameservers.map((n) => `nameserver ${n}\n`).join('')}`;
}
