import { describe, expect, it } from 'vitest';
import { cidrToString, parseCidr, isLoopbackCidr } from '../../../src/redirect/cidr.js';

describe('parseCidr (Go netip.ParsePrefix semantics)', () => {
  it('keeps the address as written and masks only the bytes', () => {
    const c = parseCidr('10.1.2.3/8');
    expect(c).toMatchObject({ family: 4, address: '10.1.2.3', prefix: 8 });
    expect([...c.bytes]).toEqual([10, 0, 0, 0]);
    expect(cidrToString(c)).toBe('10.1.2.3/8');
  });

  it('prints IPv6 in RFC 5952 form like Go', () => {
    expect(cidrToString(parseCidr('2001:DB8:0:0:0:0:0:1/64'))).toBe('2001:db8::1/64');
    expect(cidrToString(parseCidr('2001:db8:0:0:1:0:0:1/128'))).toBe('2001:db8::1:0:0:1/128');
    expect(cidrToString(parseCidr('::/0'))).toBe('::/0');
    expect(cidrToString(parseCidr('::ffff:1.2.3.4/128'))).toBe('::ffff:1.2.3.4/128');
    expect(cidrToString(parseCidr('2001:db8:1:1:1:1:0:1/64'))).toBe('2001:db8:1:1:1:1:0:1/64');
    expect(parseCidr('2001:db8::ff00/120').bytes.toString('hex')).toBe('20010db800000000000000000000ff00');
    expect(parseCidr('2001:db8::ff00/112').bytes.toString('hex')).toBe('20010db8000000000000000000000000');
  });

  it.each(['10.0.0.0', '10.0.0.0/33', '010.0.0.0/8', '10.0.0/8', 'fe80::1%eth0/64', '10.0.0.0/08', 'abc/8', '1:2:3:4:5:6:7:8:9/64', ''])(
    'rejects %j',
    (t) => expect(() => parseCidr(t)).toThrow(/netip.ParsePrefix/),
  );

  it('recognises loopback addresses', () => {
    expect(isLoopbackCidr(parseCidr('127.0.0.1/32'))).toBe(true);
    expect(isLoopbackCidr(parseCidr('127.1.0.0/16'))).toBe(true);
    expect(isLoopbackCidr(parseCidr('::1/128'))).toBe(true);
    expect(isLoopbackCidr(parseCidr('10.0.0.1/32'))).toBe(false);
  });
});
