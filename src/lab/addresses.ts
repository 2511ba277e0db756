// The only addresses a lab may put on an interface: 198.18.0.0/15 (RFC 2544,
// benchmarking) and 2001:db8::/32 (RFC 3849, documentation). Neither is
// routed anywhere, and a lab namespace gets no default route, so traffic to
// them cannot leave the namespaces the lab made.
import { BlockList, isIP } from 'node:net';

const allowed = new BlockList();
allowed.addSubnet('198.18.0.0', 15, 'ipv4');
allowed.addSubnet('2001:db8::', 32, 'ipv6');

export const LAB_RANGES = ['198.18.0.0/15', '2001:db8::/32'] as const;

/** Throws unless `cidr` (address[/prefix]) lies inside the lab ranges, prefix included. */
export function assertLabAddress(cidr: string): void {
  const [addr = '', len] = cidr.split('/');
  const family = isIP(addr);
  if (family === 0) throw new Error(`lab address '${cidr}' is not an IP address`);
  const prefix = len === undefined ? (family === 4 ? 32 : 128) : Number(len);
  const min = family === 4 ? 15 : 32;
  if (!Number.isInteger(prefix) || prefix < min || prefix > (family === 4 ? 32 : 128) || !allowed.check(addr, family === 4 ? 'ipv4' : 'ipv6')) {
    throw new Error(`lab address '${cidr}' is outside ${LAB_RANGES.join(' and ')}: test and bench traffic must stay on addresses that exist only inside the lab's namespaces`);
  }
}
