// CIDR parsing and printing with the semantics of Go's netip.ParsePrefix /
// Prefix.String(), because istio-iptables prints parsed prefixes back into
// its rules (`-d 10.0.0.0/8`) and meshcap must print them byte for byte.
// Go keeps the address as written (no masking), prints IPv6 in RFC 5952 form,
// and treats an IPv4-mapped IPv6 address as IPv6.

export interface Cidr {
  family: 4 | 6;
  /** Canonical text of the address as written (Go netip form, not masked). */
  address: string;
  prefix: number;
  /** Network-order address bytes (4 or 16), masked to `prefix`, for datapaths. */
  bytes: Buffer;
}

export class CidrParseError extends Error {}

const V4_OCTET = /^(0|[1-9][0-9]{0,2})$/;

/** Parses dotted IPv4 the way Go does (no leading zeros, exactly four octets). */
export function parseIPv4(text: string): Buffer | null {
  const parts = text.split('.');
  if (parts.length !== 4) return null;
  const out = Buffer.alloc(4);
  for (let i = 0; i < 4; i++) {
    const p = parts[i] ?? '';
    if (!V4_OCTET.test(p)) return null;
    const n = Number(p);
    if (n > 255) return null;
    out[i] = n;
  }
  return out;
}

/** Parses IPv6 text (with optional embedded IPv4 tail); rejects zones. */
export function parseIPv6(text: string): Buffer | null {
  if (text.includes('%')) return null;
  let s = text;
  let tail: Buffer | null = null;
  const lastColon = s.lastIndexOf(':');
  if (s.slice(lastColon + 1).includes('.')) {
    tail = parseIPv4(s.slice(lastColon + 1));
    if (!tail) return null;
    s = s.slice(0, lastColon + 1) + '0:0';
  }
  const dbl = s.indexOf('::');
  if (dbl !== s.lastIndexOf('::')) return null;
  const parseGroups = (g: string): number[] | null => {
    if (g === '') return [];
    const out: number[] = [];
    for (const h of g.split(':')) {
      if (!/^[0-9a-fA-F]{1,4}$/.test(h)) return null;
      out.push(parseInt(h, 16));
    }
    return out;
  };
  let groups: number[];
  if (dbl >= 0) {
    const head = parseGroups(s.slice(0, dbl));
    const rest = parseGroups(s.slice(dbl + 2));
    if (!head || !rest) return null;
    const fill = 8 - head.length - rest.length;
    if (fill < 1) return null;
    groups = [...head, ...new Array<number>(fill).fill(0), ...rest];
  } else {
    const all = parseGroups(s);
    if (!all || all.length !== 8) return null;
    groups = all;
  }
  const out = Buffer.alloc(16);
  groups.forEach((g, i) => out.writeUInt16BE(g, i * 2));
  if (tail) tail.copy(out, 12);
  return out;
}

export function formatIPv4(b: Buffer): string {
  return `${b[0]}.${b[1]}.${b[2]}.${b[3]}`;
}

/** RFC 5952 text, as Go's netip.Addr.String() prints it. */
export function formatIPv6(b: Buffer): string {
  const isMapped = b.subarray(0, 10).every((x) => x === 0) && b[10] === 0xff && b[11] === 0xff;
  if (isMapped) return `::ffff:${formatIPv4(b.subarray(12))}`;
  const groups: number[] = [];
  for (let i = 0; i < 8; i++) groups.push(b.readUInt16BE(i * 2));
  // Longest run of >= 2 zero groups, first one on a tie.
  let bestStart = -1;
  let bestLen = 0;
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen && j - i >= 2) {
      bestStart = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = (g: number) => g.toString(16);
  if (bestStart < 0) return groups.map(hex).join(':');
  const head = groups.slice(0, bestStart).map(hex).join(':');
  const tail = groups.slice(bestStart + bestLen).map(hex).join(':');
  return `${head}::${tail}`;
}

export interface ParsedAddr {
  family: 4 | 6;
  bytes: Buffer;
  text: string;
}

/** Parses a bare IP address (Go netip.ParseAddr semantics, no zones). */
export function parseAddr(text: string): ParsedAddr | null {
  const a = parseAddrBytes(text);
  if (!a) return null;
  return { ...a, text: a.family === 6 ? formatIPv6(a.bytes) : formatIPv4(a.bytes) };
}

/** parseAddr without the canonical text (a datapath needs only the bytes). */
export function parseAddrBytes(text: string): { family: 4 | 6; bytes: Buffer } | null {
  if (text.includes(':')) {
    const b = parseIPv6(text);
    return b ? { family: 6, bytes: b } : null;
  }
  const b = parseIPv4(text);
  return b ? { family: 4, bytes: b } : null;
}

function mask(bytes: Buffer, prefix: number): Buffer {
  const out = Buffer.from(bytes);
  for (let i = 0; i < out.length; i++) {
    const bits = Math.max(0, Math.min(8, prefix - i * 8));
    out[i] = (out[i] ?? 0) & ((0xff << (8 - bits)) & 0xff);
  }
  return out;
}

/** Go netip.ParsePrefix: `addr/bits`, bits decimal without leading zeros. */
export function parseCidr(text: string): Cidr {
  const slash = text.lastIndexOf('/');
  if (slash < 0) throw new CidrParseError(`netip.ParsePrefix("${text}"): no '/'`);
  const addr = parseAddr(text.slice(0, slash));
  if (!addr) throw new CidrParseError(`netip.ParsePrefix("${text}"): bad IP address`);
  const bitsText = text.slice(slash + 1);
  const max = addr.family === 4 ? 32 : 128;
  if (!/^(0|[1-9][0-9]*)$/.test(bitsText) || Number(bitsText) > max) {
    throw new CidrParseError(`netip.ParsePrefix("${text}"): bad bits after slash: "${bitsText}"`);
  }
  const prefix = Number(bitsText);
  return { family: addr.family, address: addr.text, prefix, bytes: mask(addr.bytes, prefix) };
}

export function cidrToString(c: Cidr): string {
  return `${c.address}/${c.prefix}`;
}

/** netip.Addr.IsLoopback on the address as written (127/8 for v4, ::1 for v6). */
export function isLoopbackCidr(c: Cidr): boolean {
  const a = c.family === 4 ? parseIPv4(c.address) : parseIPv6(c.address);
  if (!a) return false;
  if (c.family === 4) return a[0] === 127;
  return a.subarray(0, 15).every((x) => x === 0) && a[15] === 1;
}
