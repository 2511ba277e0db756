// Cases beyond Istio's golden vectors (test/fixtures/istio). No upstream golden exists for these at the
// vectors' commit, so each expected text was derived by hand from
// tools/istio-iptables/pkg/capture/run.go (Run, handleInboundPortsInclude,
// SetupDNSRedir, addDNSConntrackZones, handleCaptureByOwnerGroup,
// handleOutboundIncludeRules) and builder/iptables_builder_impl.go (buildRestore).
import { describe, expect, it } from 'vitest';
import { parseIstioIptablesArgs, type ParseFlagsOptions } from '../../../src/redirect/flags.js';
import { renderIptables } from '../../../src/fallback-iptables/render.js';

const BASE = ['-p', '15001', '-z', '15006', '-e', '15008', '-u', '1337', '-g', '1337', '-t', '1337', '-r', '133'];
const render = (flags: string[], opts: ParseFlagsOptions = {}) =>
  renderIptables(parseIstioIptablesArgs([...BASE, ...flags], { lookupUser: () => undefined, ...opts }).config);
const lines = (...l: string[]) => l.map((x) => `${x}\n`).join('');

// The nat prologue every config shares (tunnel RETURN, the two REDIRECT chains).
const NAT_HEAD = ['-A ISTIO_INBOUND -p tcp --dport 15008 -j RETURN', '-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001', '-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006'];
const OWNER_V4 = [
  '-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN',
  '-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT',
  '-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN',
  '-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN',
  '-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT',
  '-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN',
  '-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN',
];

describe('renderIptables beyond the vectors (expected text derived from run.go)', () => {
  it('TPROXY with an excluded interface and inbound ports list', () => {
    const out = render(['-m', 'TPROXY', '-b', '80', '-c', 'eth9', '-i', '*']);
    expect(out.v6).toBeNull();
    expect(out.v4).toBe(lines(
      '* mangle',
      '-N ISTIO_DIVERT', '-N ISTIO_TPROXY', '-N ISTIO_INBOUND',
      '-A PREROUTING -i eth9 -j RETURN',
      '-A OUTPUT -o eth9 -j RETURN',
      '-A ISTIO_DIVERT -j MARK --set-mark 1337',
      '-A ISTIO_DIVERT -j ACCEPT',
      '-A ISTIO_TPROXY ! -d 127.0.0.1/32 -p tcp -j TPROXY --tproxy-mark 1337/0xffffffff --on-port 15006',
      '-A PREROUTING -p tcp -j ISTIO_INBOUND',
      '-A ISTIO_INBOUND -p tcp --dport 80 -m conntrack --ctstate RELATED,ESTABLISHED -j ISTIO_DIVERT',
      '-A ISTIO_INBOUND -p tcp --dport 80 -j ISTIO_TPROXY',
      '-A PREROUTING -p tcp -m mark --mark 1337 -j CONNMARK --save-mark',
      '-A OUTPUT -p tcp -o lo -m mark --mark 1337 -j RETURN',
      '-A OUTPUT ! -d 127.0.0.1/32 -p tcp -o lo -m owner --uid-owner 1337 -j MARK --set-mark 1338',
      '-A OUTPUT ! -d 127.0.0.1/32 -p tcp -o lo -m owner --gid-owner 1337 -j MARK --set-mark 1338',
      '-A OUTPUT -p tcp -m connmark --mark 1337 -j CONNMARK --restore-mark',
      '-I ISTIO_INBOUND 1 -p tcp -m mark --mark 1337 -j RETURN',
      '-I ISTIO_INBOUND 2 -p tcp -s 127.0.0.6/32 -i lo -j RETURN',
      '-I ISTIO_INBOUND 3 -p tcp -i lo -m mark ! --mark 1338 -j RETURN',
      'COMMIT',
      '* nat',
      '-N ISTIO_INBOUND', '-N ISTIO_REDIRECT', '-N ISTIO_IN_REDIRECT', '-N ISTIO_OUTPUT',
      '-A PREROUTING -i eth9 -j RETURN',
      '-A OUTPUT -o eth9 -j RETURN',
      ...NAT_HEAD,
      '-A OUTPUT -j ISTIO_OUTPUT',
      ...OWNER_V4,
      '-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN',
      '-A ISTIO_OUTPUT -j ISTIO_REDIRECT',
      'COMMIT',
    ));
  });

  it('DNS to listed servers (v4 + v6), IPv6 enabled, outbound include ports', () => {
    const out = render(['--redirect-dns', '-q', '8080', '-x', '10.9.0.0/16,2001:db8:9::/48'], {
      enableIPv6: true, dnsServersV4: ['10.96.0.10'], dnsServersV6: ['2001:db8::53'],
    });
    const nat = (fam: 4 | 6) => {
      const lo = fam === 4 ? '127.0.0.1/32' : '::1/128';
      const src = fam === 4 ? '127.0.0.6/32' : '::6/128';
      const srv = fam === 4 ? '10.96.0.10/32' : '2001:db8::53/128';
      return [
        '* nat',
        '-N ISTIO_INBOUND', '-N ISTIO_REDIRECT', '-N ISTIO_IN_REDIRECT', '-N ISTIO_OUTPUT', '-N ISTIO_OUTPUT_DNS',
        ...NAT_HEAD,
        '-A OUTPUT -j ISTIO_OUTPUT',
        `-A ISTIO_OUTPUT -o lo -s ${src} -j RETURN`,
        `-A ISTIO_OUTPUT -o lo ! -d ${lo} -p tcp -m multiport ! --dports 53,15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT`,
        '-A ISTIO_OUTPUT -o lo -p tcp ! --dport 53 -m owner ! --uid-owner 1337 -j RETURN',
        '-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN',
        `-A ISTIO_OUTPUT -o lo ! -d ${lo} -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT`,
        '-A ISTIO_OUTPUT -o lo -p tcp ! --dport 53 -m owner ! --gid-owner 1337 -j RETURN',
        '-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN',
        '-A ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS',
        `-A ISTIO_OUTPUT_DNS -p tcp --dport 53 -d ${srv} -j REDIRECT --to-ports 15053`,
        `-A ISTIO_OUTPUT_DNS -p udp --dport 53 -d ${srv} -j REDIRECT --to-port 15053`,
        `-A ISTIO_OUTPUT -d ${lo} -j RETURN`,
        `-A ISTIO_OUTPUT -d ${fam === 4 ? '10.9.0.0/16' : '2001:db8:9::/48'} -j RETURN`,
        '-A ISTIO_OUTPUT -p tcp --dport 8080 -j ISTIO_REDIRECT',
        'COMMIT',
        '* raw',
        '-N ISTIO_OUTPUT_DNS', '-N ISTIO_INBOUND',
        '-A OUTPUT -j ISTIO_OUTPUT_DNS',
        '-A ISTIO_OUTPUT_DNS -p udp --dport 53 -m owner --uid-owner 1337 -j CT --zone 1',
        '-A ISTIO_OUTPUT_DNS -p udp --sport 15053 -m owner --uid-owner 1337 -j CT --zone 2',
        '-A ISTIO_OUTPUT_DNS -p udp --dport 53 -m owner --gid-owner 1337 -j CT --zone 1',
        '-A ISTIO_OUTPUT_DNS -p udp --sport 15053 -m owner --gid-owner 1337 -j CT --zone 2',
        '-A PREROUTING -j ISTIO_INBOUND',
        `-A ISTIO_OUTPUT_DNS -p udp --dport 53 -d ${srv} -j CT --zone 2`,
        `-A ISTIO_INBOUND -p udp --sport 53 -s ${srv} -j CT --zone 1`,
        'COMMIT',
      ];
    };
    expect(out.v4).toBe(lines(...nat(4)));
    expect(out.v6).toBe(lines(...nat(6)));
  });

  it('DNS servers of one family only jump to ISTIO_OUTPUT_DNS in that family', () => {
    const out = render(['--redirect-dns', '-i', '*'], { enableIPv6: true, dnsServersV4: ['10.96.0.10'] });
    expect(out.v4).toContain('-A ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS\n');
    expect(out.v6).not.toContain('-A ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS\n');
    expect(out.v6).not.toContain('-A PREROUTING -j ISTIO_INBOUND\n');
    // raw/OUTPUT jump is unconditional in SetupDNSRedir, so v6 still gets it.
    expect(out.v6).toContain('* raw\n-N ISTIO_OUTPUT_DNS\n-A OUTPUT -j ISTIO_OUTPUT_DNS\n');
  });

  it('--redirect-dns without servers and without --capture-all-dns renders no DNS rules', () => {
    expect(render(['--redirect-dns', '-i', '*'])).toEqual(render(['-i', '*']));
  });

  it('--capture-all-dns captures all port-53 traffic', () => {
    const v4 = render(['--redirect-dns', '--capture-all-dns']).v4;
    expect(v4).toContain(lines(
      '-A ISTIO_OUTPUT -j ISTIO_OUTPUT_DNS',
      '-A ISTIO_OUTPUT_DNS -p tcp --dport 53 -j REDIRECT --to-ports 15053',
      '-A ISTIO_OUTPUT_DNS -p udp --dport 53 -j REDIRECT --to-port 15053',
    ));
    expect(v4).toContain(lines(
      '-A PREROUTING -j ISTIO_INBOUND',
      '-A ISTIO_OUTPUT_DNS -p udp --dport 53 -j CT --zone 2',
      '-A ISTIO_INBOUND -p udp --sport 53 -j CT --zone 1',
      'COMMIT',
    ));
  });

  it('owner groups include: one rule returning every other group', () => {
    const v4 = render(['-i', '*'], { env: { ISTIO_OUTBOUND_OWNER_GROUPS: 'java,202' } }).v4;
    expect(v4).toContain(lines(
      '-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN',
      '-A ISTIO_OUTPUT -m owner ! --gid-owner java -m owner ! --gid-owner 202 -j RETURN',
      '-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN',
    ));
  });

  it('owner groups exclude: one RETURN per excluded group', () => {
    const v4 = render(['-i', '*'], { env: { ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE: 'python,201' } }).v4;
    expect(v4).toContain(lines(
      '-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN',
      '-A ISTIO_OUTPUT -m owner --gid-owner python -j RETURN',
      '-A ISTIO_OUTPUT -m owner --gid-owner 201 -j RETURN',
      '-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN',
    ));
  });

  it('kube-virt interfaces with IPv6 CIDRs: PREROUTING inserts per family, later inserts first', () => {
    const out = render(['-k', 'eth1,eth2', '-i', '10.0.0.0/8,2001:db8::/32'], { enableIPv6: true });
    const expectNat = (lo: string, src: string, cidr: string) => lines(
      '* nat',
      '-N ISTIO_INBOUND', '-N ISTIO_REDIRECT', '-N ISTIO_IN_REDIRECT', '-N ISTIO_OUTPUT',
      '-I PREROUTING 1 -i eth1 -j RETURN',
      '-I PREROUTING 1 -i eth2 -j RETURN',
      ...NAT_HEAD,
      '-A OUTPUT -j ISTIO_OUTPUT',
      `-A ISTIO_OUTPUT -o lo -s ${src} -j RETURN`,
      `-A ISTIO_OUTPUT -o lo ! -d ${lo} -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT`,
      '-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN',
      '-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN',
      `-A ISTIO_OUTPUT -o lo ! -d ${lo} -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT`,
      '-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN',
      '-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN',
      `-A ISTIO_OUTPUT -d ${lo} -j RETURN`,
      `-I PREROUTING 1 -i eth1 -d ${cidr} -j ISTIO_REDIRECT`,
      `-I PREROUTING 1 -i eth2 -d ${cidr} -j ISTIO_REDIRECT`,
      `-A ISTIO_OUTPUT -d ${cidr} -j ISTIO_REDIRECT`,
      'COMMIT',
    );
    expect(out.v4).toBe(expectNat('127.0.0.1/32', '127.0.0.6/32', '10.0.0.0/8'));
    expect(out.v6).toBe(expectNat('::1/128', '::6/128', '2001:db8::/32'));
  });

  it('a loopback include CIDR drops the "-o lo ! --uid-owner" RETURN rules', () => {
    const v4 = render(['-i', '127.0.0.1/32,10.0.0.0/8']).v4;
    expect(v4).not.toContain('-o lo -m owner !');
    expect(v4).toContain('-A ISTIO_OUTPUT -d 127.0.0.1/32 -j ISTIO_REDIRECT\n-A ISTIO_OUTPUT -d 10.0.0.0/8 -j ISTIO_REDIRECT\n');
  });

  it('dual-stack with IPv6: v6 text mirrors v4 with v6 loopback/passthrough addresses', () => {
    const out = render(['--dual-stack', '-i', '*', '-b', '*', '-d', '15020'], { enableIPv6: true });
    expect(out.v6).toBe(out.v4.replaceAll('127.0.0.6/32', '::6/128').replaceAll('127.0.0.1/32', '::1/128'));
  });

  it('a custom ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR replaces 127.0.0.1/32 in v4 only', () => {
    const out = render(['-i', '*'], { env: { ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR: '127.0.0.0/8' }, enableIPv6: true });
    expect(out.v4).toContain('-A ISTIO_OUTPUT -d 127.0.0.0/8 -j RETURN\n');
    expect(out.v4).not.toContain('127.0.0.1/32');
    expect(out.v6).toContain('-A ISTIO_OUTPUT -d ::1/128 -j RETURN\n');
  });

  it('drop-invalid with TPROXY puts the DROP chain in mangle', () => {
    const v4 = render(['--drop-invalid', '-m', 'TPROXY', '-b', '*']).v4;
    expect(v4.startsWith(lines('* mangle', '-N ISTIO_DROP', '-N ISTIO_DIVERT', '-N ISTIO_TPROXY', '-N ISTIO_INBOUND',
      '-A PREROUTING -m conntrack --ctstate INVALID -j ISTIO_DROP', '-A ISTIO_DROP -j DROP'))).toBe(true);
  });
});
