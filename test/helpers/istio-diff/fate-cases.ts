// Generated capture configs for the fates test (rules applied, not just
// text): istio-iptables command lines as istio-cni builds them for a sidecar
// pod (-p 15001 -z 15006 -u 1337 -g 1337 ...), in the same FlagCase shape as
// the renderer differential (flag-cases.ts) so cases print the same way.
// Only valid invocations (the renderer test covers rejections), with CIDRs
// and ports that matter to the lab's destinations (fates.ts): ranges that
// cover some servers and not others, v4 and v6, loopback-covering ranges
// and TPROXY (which eBPF mode refuses by design), plus a few of the renderer
// arbitrary's ranges that cover none of the lab.
import fc from 'fast-check';
import type { FlagCase } from './flag-cases.js';

const include = fc.oneof(
  { weight: 4, arbitrary: fc.constant('*') },
  { weight: 6, arbitrary: fc.constantFrom(
    '', '198.18.1.0/24', '198.18.0.0/15', '198.19.0.0/16', '198.18.2.10/32,2001:db8:2::/48', '2001:db8:1::/48',
    '198.18.1.0/24,2001:db8::/32', '10.0.0.0/8', '192.168.0.0/16,fd00::/8', '0.0.0.0/0,::/0', '127.0.0.1/32', '198.18.0.0/15,::1/128',
  ) },
);
const exclude = fc.constantFrom('', '', '198.18.2.0/24', '198.19.128.0/17', '2001:db8:2::/48', '198.18.1.10/32,2001:db8:1::10/128', '10.0.0.0/8', '198.18.0.0/16,2001:db8::/33');
const inboundPorts = fc.oneof({ weight: 4, arbitrary: fc.constant('*') }, { weight: 3, arbitrary: fc.constantFrom('', '8080', '8080,15020', '9090,15008,15006') });
const inboundExclude = fc.constantFrom('15090,15021,15020', '15090,15021,15020', '', '8080', '15090,15021,15020,9090', '15001');
const outboundPorts = fc.constantFrom('', '', '', '5555', '443,5555');
const outboundExclude = fc.constantFrom('', '', '5555', '80', '15006');
const mode = fc.constantFrom('REDIRECT', 'REDIRECT', 'REDIRECT', 'REDIRECT', 'TPROXY');

export const fateCase: fc.Arbitrary<FlagCase> = fc.record({
  include, exclude, inboundPorts, inboundExclude, outboundPorts, outboundExclude, mode, dualStack: fc.boolean(),
}).map((g): FlagCase => ({
  args: [
    '-p', '15001', '-z', '15006', '-u', '1337', '-g', '1337', '-m', g.mode,
    '-i', g.include, '-x', g.exclude, '-b', g.inboundPorts, '-d', g.inboundExclude,
    ...(g.outboundPorts ? ['-q', g.outboundPorts] : []), ...(g.outboundExclude ? ['-o', g.outboundExclude] : []),
  ],
  env: g.dualStack ? { ISTIO_DUAL_STACK: 'true' } : ({} as Record<string, string>),
  family: 'dual',
  nameservers: [],
}));

/** The configs of a run (fast-check's generator with a fixed seed: reproducible). */
export function generateFateCases(seed: number, runs: number): FlagCase[] {
  return fc.sample(fateCase, { seed, numRuns: runs });
}
