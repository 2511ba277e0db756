import { describe, expect, it } from 'vitest';
import { CaptureConfigError } from '../../../src/redirect/config.js';
import { FlagParseError, parseIstioIptablesArgs } from '../../../src/redirect/flags.js';

const noUser = () => undefined;

describe('parseIstioIptablesArgs', () => {
  it('applies istio-iptables defaults with no flags', () => {
    const { config } = parseIstioIptablesArgs([], { lookupUser: noUser });
    expect(config).toMatchObject({
      proxyPort: '15001', inboundCapturePort: '15006', inboundTunnelPort: '15008',
      proxyUID: ['1337'], proxyGID: ['1337'], inboundInterceptionMode: 'REDIRECT',
      inboundPortsInclude: '', outboundIPRangesInclude: '', ownerGroupsInclude: '*', hostIPv4LoopbackCidr: '127.0.0.1/32',
    });
    expect(config.parsed).toMatchObject({ proxyPort: 15001, dnsPort: 15053, inboundCapture: false, outboundIncludeAll: false, dnsCapture: 'off' });
  });

  it('defaults -u to ENVOY_USER\'s uid and -g to -u', () => {
    const { config } = parseIstioIptablesArgs([], { env: { ENVOY_USER: 'envoy' }, lookupUser: (n) => (n === 'envoy' ? '101' : undefined) });
    expect(config.proxyUID).toEqual(['101']);
    expect(config.proxyGID).toEqual(['101']);
  });

  it('parses pflag syntax: -p 1, -p1, -p=1, --long v, --long=v, bools, grouped shorts', () => {
    const { config, runtime, args } = parseIstioIptablesArgs(
      ['-p', '15101', '-z15106', '-e=15108', '--proxy-uid', '1,2', '--proxy-gid=3', '-nb', '80,443', '--redirect-dns', '--drop-invalid=false', 'extra'],
      { lookupUser: noUser },
    );
    expect(config.proxyPort).toBe('15101');
    expect(config.inboundCapturePort).toBe('15106');
    expect(config.inboundTunnelPort).toBe('15108');
    expect(config.parsed.proxyUids).toEqual([1, 2]);
    expect(config.parsed.proxyGids).toEqual([3]);
    expect(runtime.dryRun).toBe(true);
    expect(config.parsed.inboundIncludePorts).toEqual([80, 443]);
    expect(config.redirectDNS).toBe(true);
    expect(config.dropInvalid).toBe(false);
    expect(args).toEqual(['extra']);
  });

  it('reads env vars like flag.BindEnv and lets the command line win', () => {
    const env = { ISTIO_INBOUND_PORTS: '*', ISTIO_SERVICE_CIDR: '10.0.0.0/8', ISTIO_META_DNS_CAPTURE: 'true', INVALID_DROP: '1', ISTIO_OUTBOUND_OWNER_GROUPS: 'a,b' };
    const { config } = parseIstioIptablesArgs(['-i', '*'], { env, lookupUser: noUser });
    expect(config.inboundPortsInclude).toBe('*');
    expect(config.outboundIPRangesInclude).toBe('*');
    expect(config.redirectDNS).toBe(true);
    expect(config.dropInvalid).toBe(true);
    expect(config.parsed.ownerGroups).toEqual({ except: false, values: ['a', 'b'] });
  });

  it('takes DNS servers only when redirecting DNS without capture-all (replacing resolv.conf)', () => {
    const o = { lookupUser: noUser, dnsServersV4: ['10.96.0.10'], dnsServersV6: ['2001:db8::53'] };
    expect(parseIstioIptablesArgs(['--redirect-dns'], o).config.parsed).toMatchObject({ dnsCapture: 'servers', dnsServersV4: ['10.96.0.10'] });
    expect(parseIstioIptablesArgs(['--redirect-dns', '--capture-all-dns'], o).config).toMatchObject({ dnsServersV4: [], parsed: { dnsCapture: 'all' } });
    expect(parseIstioIptablesArgs(['--redirect-dns'], { lookupUser: noUser }).config.parsed.dnsCapture).toBe('off');
  });

  it('splits CIDRs by family', () => {
    const { config } = parseIstioIptablesArgs(['-i', '10.0.0.0/8,2001:db8::/32', '-x', '10.1.0.0/16'], { lookupUser: noUser });
    expect(config.parsed.outboundIncludeCidrs.v4.map((c) => c.address)).toEqual(['10.0.0.0']);
    expect(config.parsed.outboundIncludeCidrs.v6.map((c) => c.prefix)).toEqual([32]);
    expect(config.parsed.outboundExcludeCidrs.v4[0]?.prefix).toBe(16);
  });

  const bad: Array<[string[], Record<string, string>, RegExp]> = [
    [['-i', '10.0.0.0/33'], {}, /-i, --istio-service-cidr/],
    [['-x', '*'], {}, /--istio-service-exclude-cidr/],
    [['-b', '80,http'], {}, /-b, --istio-inbound-ports.*"http" is not a port/],
    [['-b', '*', '-d', '70000'], {}, /-d, --istio-local-exclude-ports/],
    [['-q', '*'], {}, /-q, --istio-outbound-ports/],
    [['-m', 'tproxy'], {}, /-m, --istio-inbound-interception-mode.*REDIRECT/],
    [['-p', 'x'], {}, /-p, --envoy-port/],
    [['-u', 'istio'], {}, /-u, --proxy-uid/],
    [['-k', 'a/b'], {}, /-k, --kube-virt-interfaces/],
    [[], { ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR: '10.0.0.1/32' }, /ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR/],
    [[], { ISTIO_INBOUND_PORTS: 'x' }, /environment variable ISTIO_INBOUND_PORTS/],
  ];
  it.each(bad)('rejects %j %j naming the source', (argv, env, re) => {
    let err: unknown;
    try {
      parseIstioIptablesArgs(argv, { env, lookupUser: noUser });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(CaptureConfigError);
    expect((err as Error).message).toMatch(re);
  });

  it('rejects unknown flags, missing values and bad booleans', () => {
    expect(() => parseIstioIptablesArgs(['--nope'])).toThrow(FlagParseError);
    expect(() => parseIstioIptablesArgs(['-Z'])).toThrow(/unknown shorthand flag: 'Z'/);
    expect(() => parseIstioIptablesArgs(['-p'])).toThrow(/needs an argument/);
    expect(() => parseIstioIptablesArgs(['--drop-invalid=maybe'])).toThrow(/--drop-invalid/);
    expect(() => parseIstioIptablesArgs(['--force-iptables-binary', 'iptables-nft'])).toThrow(/must be "legacy" or "nft"/);
    expect(parseIstioIptablesArgs(['--force-iptables-binary', 'nft'], { lookupUser: noUser }).runtime.forceIptablesBinary).toBe('nft');
  });

  it('an environment value that does not parse is its zero value, as pflag leaves it (istio-iptables ignores the error)', () => {
    const warnings: string[] = [];
    const r = parseIstioIptablesArgs([], { env: { DUAL_STACK: 'true', ISTIO_DUAL_STACK: 'yes' }, lookupUser: noUser, onWarning: (m) => warnings.push(m) });
    expect(r.config.dualStack).toBe(false);
    expect(warnings.join('\n')).toMatch(/ISTIO_DUAL_STACK.*taken as false/);
  });

  it('limits included owner groups to 64 like config.ValidateOwnerGroups', () => {
    const many = Array.from({ length: 65 }, (_, i) => String(i)).join(',');
    expect(() => parseIstioIptablesArgs([], { env: { ISTIO_OUTBOUND_OWNER_GROUPS: many }, lookupUser: noUser })).toThrow(/cannot exceed 64/);
  });
});
