// CaptureConfig -> iptables-restore input, a port of istio-iptables'
// capture/run.go (IptablesConfigurator.Run, SetupDNSRedir,
// addDNSConntrackZones) rendered by builder.ts. Rule order and text follow
// run.go line by line; Istio's golden vectors (test/fixtures/istio) check it
// byte for byte.
import type { CaptureConfig } from '../redirect/config.js';
import { cidrToString } from '../redirect/cidr.js';
import { splitList } from '../redirect/config.js';
import { IP_VERSION_SPECIFIC as V, IptablesRuleBuilder } from './builder.js';

export const ISTIO_OUTPUT = 'ISTIO_OUTPUT';
export const ISTIO_OUTPUT_DNS = 'ISTIO_OUTPUT_DNS';
export const ISTIO_INBOUND = 'ISTIO_INBOUND';
export const ISTIO_DIVERT = 'ISTIO_DIVERT';
export const ISTIO_TPROXY = 'ISTIO_TPROXY';
export const ISTIO_REDIRECT = 'ISTIO_REDIRECT';
export const ISTIO_IN_REDIRECT = 'ISTIO_IN_REDIRECT';
export const ISTIO_DROP = 'ISTIO_DROP';
/** constants.OutboundMark: envoy outbound -> envoy inbound via pod IP in TPROXY mode. */
export const OUTBOUND_MARK = '1338';
const DNS_PORT = '15053';

export interface RenderedRules {
  v4: string;
  /** null when IPv6 is off (Istio renders nothing for v6 then). */
  v6: string | null;
}

/** Builds the rule set (both families) the way run.go's Run() does. */
export function buildIstioRules(cfg: CaptureConfig): IptablesRuleBuilder {
  const b = new IptablesRuleBuilder(cfg.enableIPv6);
  const p = cfg.parsed;
  const tproxy = cfg.inboundInterceptionMode === 'TPROXY';
  const loopV4 = cfg.hostIPv4LoopbackCidr;
  const inc = { wildcard: p.outboundIncludeAll, v4: p.outboundIncludeCidrs.v4, v6: p.outboundIncludeCidrs.v6 };
  // REDIRECT_DNS without CAPTURE_ALL_DNS and without servers disables DNS capture.
  const redirectDNS = p.dnsCapture !== 'off';
  const hasLoopbackInclude = p.outboundIncludesLoopback;

  // shortCircuitExcludeInterfaces
  for (const i of splitList(cfg.excludeInterfaces)) {
    b.appendRule('PREROUTING', 'nat', '-i', i, '-j', 'RETURN');
    b.appendRule('OUTPUT', 'nat', '-o', i, '-j', 'RETURN');
  }
  if (tproxy) {
    for (const i of splitList(cfg.excludeInterfaces)) {
      b.appendRule('PREROUTING', 'mangle', '-i', i, '-j', 'RETURN');
      b.appendRule('OUTPUT', 'mangle', '-o', i, '-j', 'RETURN');
    }
  }
  // shortCircuitKubeInternalInterface
  for (const i of splitList(cfg.kubeVirtInterfaces)) b.insertRule('PREROUTING', 'nat', 1, '-i', i, '-j', 'RETURN');

  if (cfg.dropInvalid) {
    b.appendRule('PREROUTING', 'mangle', '-m', 'conntrack', '--ctstate', 'INVALID', '-j', ISTIO_DROP);
    b.appendRule(ISTIO_DROP, 'mangle', '-j', 'DROP');
  }

  b.appendRule(ISTIO_INBOUND, 'nat', '-p', 'tcp', '--dport', cfg.inboundTunnelPort, '-j', 'RETURN');
  b.appendRule(ISTIO_REDIRECT, 'nat', '-p', 'tcp', '-j', 'REDIRECT', '--to-ports', cfg.proxyPort);
  b.appendRule(ISTIO_IN_REDIRECT, 'nat', '-p', 'tcp', '-j', 'REDIRECT', '--to-ports', cfg.inboundCapturePort);

  handleInboundPortsInclude(b, cfg, tproxy);

  b.appendRule('OUTPUT', 'nat', '-j', ISTIO_OUTPUT);

  for (const port of splitList(cfg.outboundPortsExclude)) {
    b.appendRule(ISTIO_OUTPUT, 'nat', '-p', 'tcp', '--dport', port, '-j', 'RETURN');
    b.appendRule(ISTIO_OUTPUT, 'nat', '-p', 'udp', '--dport', port, '-j', 'RETURN');
  }

  // 127.0.0.6 / ::6 is the inbound passthrough cluster's bind address.
  b.appendVersionedRule('127.0.0.6/32', '::6/128', ISTIO_OUTPUT, 'nat', '-o', 'lo', '-s', V, '-j', 'RETURN');

  for (const uid of cfg.proxyUID) {
    if (redirectDNS) {
      b.appendVersionedRule(loopV4, '::1/128', ISTIO_OUTPUT, 'nat', '-o', 'lo', '!', '-d', V, '-p', 'tcp',
        '-m', 'multiport', '!', '--dports', `53,${cfg.inboundTunnelPort}`, '-m', 'owner', '--uid-owner', uid, '-j', ISTIO_IN_REDIRECT);
    } else {
      b.appendVersionedRule(loopV4, '::1/128', ISTIO_OUTPUT, 'nat', '-o', 'lo', '!', '-d', V, '-p', 'tcp',
        '!', '--dport', cfg.inboundTunnelPort, '-m', 'owner', '--uid-owner', uid, '-j', ISTIO_IN_REDIRECT);
    }
    if (!hasLoopbackInclude) {
      if (redirectDNS) {
        b.appendRule(ISTIO_OUTPUT, 'nat', '-o', 'lo', '-p', 'tcp', '!', '--dport', '53', '-m', 'owner', '!', '--uid-owner', uid, '-j', 'RETURN');
      } else {
        b.appendRule(ISTIO_OUTPUT, 'nat', '-o', 'lo', '-m', 'owner', '!', '--uid-owner', uid, '-j', 'RETURN');
      }
    }
    b.appendRule(ISTIO_OUTPUT, 'nat', '-m', 'owner', '--uid-owner', uid, '-j', 'RETURN');
  }

  for (const gid of cfg.proxyGID) {
    b.appendVersionedRule(loopV4, '::1/128', ISTIO_OUTPUT, 'nat', '-o', 'lo', '!', '-d', V, '-p', 'tcp',
      '!', '--dport', cfg.inboundTunnelPort, '-m', 'owner', '--gid-owner', gid, '-j', ISTIO_IN_REDIRECT);
    if (!hasLoopbackInclude) {
      if (redirectDNS) {
        b.appendRule(ISTIO_OUTPUT, 'nat', '-o', 'lo', '-p', 'tcp', '!', '--dport', '53', '-m', 'owner', '!', '--gid-owner', gid, '-j', 'RETURN');
      } else {
        b.appendRule(ISTIO_OUTPUT, 'nat', '-o', 'lo', '-m', 'owner', '!', '--gid-owner', gid, '-j', 'RETURN');
      }
    }
    b.appendRule(ISTIO_OUTPUT, 'nat', '-m', 'owner', '--gid-owner', gid, '-j', 'RETURN');
  }

  // handleCaptureByOwnerGroup
  const groups = p.ownerGroups;
  if (groups.except) {
    for (const g of groups.values) b.appendRule(ISTIO_OUTPUT, 'nat', '-m', 'owner', '--gid-owner', g, '-j', 'RETURN');
  } else {
    b.appendRule(ISTIO_OUTPUT, 'nat', ...groups.values.flatMap((g) => ['-m', 'owner', '!', '--gid-owner', g]), '-j', 'RETURN');
  }

  if (redirectDNS) setupDNSRedir(b, cfg);

  // Envoy-aware apps and container-to-container traffic use localhost.
  b.appendVersionedRule(loopV4, '::1/128', ISTIO_OUTPUT, 'nat', '-d', V, '-j', 'RETURN');
  for (const c of p.outboundExcludeCidrs.v4) b.appendRuleV4(ISTIO_OUTPUT, 'nat', '-d', cidrToString(c), '-j', 'RETURN');
  for (const c of p.outboundExcludeCidrs.v6) b.appendRuleV6(ISTIO_OUTPUT, 'nat', '-d', cidrToString(c), '-j', 'RETURN');

  for (const port of splitList(cfg.outboundPortsInclude)) {
    b.appendRule(ISTIO_OUTPUT, 'nat', '-p', 'tcp', '--dport', port, '-j', ISTIO_REDIRECT);
  }

  // handleOutboundIncludeRules, v4 then v6
  for (const fam of [4, 6] as const) {
    const append = (...a: string[]) => (fam === 4 ? b.appendRuleV4(ISTIO_OUTPUT, 'nat', ...a) : b.appendRuleV6(ISTIO_OUTPUT, 'nat', ...a));
    const insert = (...a: string[]) => (fam === 4 ? b.insertRuleV4('PREROUTING', 'nat', 1, ...a) : b.insertRuleV6('PREROUTING', 'nat', 1, ...a));
    if (inc.wildcard) {
      append('-j', ISTIO_REDIRECT);
      for (const i of splitList(cfg.kubeVirtInterfaces)) insert('-i', i, '-j', ISTIO_REDIRECT);
    } else {
      for (const c of fam === 4 ? inc.v4 : inc.v6) {
        for (const i of splitList(cfg.kubeVirtInterfaces)) insert('-i', i, '-d', cidrToString(c), '-j', ISTIO_REDIRECT);
        append('-d', cidrToString(c), '-j', ISTIO_REDIRECT);
      }
    }
  }

  if (tproxy) {
    const mark = cfg.inboundTProxyMark;
    // Save the mark set by envoy's original_src listener filter as the connection mark.
    b.appendRule('PREROUTING', 'mangle', '-p', 'tcp', '-m', 'mark', '--mark', mark, '-j', 'CONNMARK', '--save-mark');
    b.appendRule('OUTPUT', 'mangle', '-p', 'tcp', '-o', 'lo', '-m', 'mark', '--mark', mark, '-j', 'RETURN');
    for (const uid of cfg.proxyUID) {
      b.appendVersionedRule(loopV4, '::1/128', 'OUTPUT', 'mangle', '!', '-d', V, '-p', 'tcp', '-o', 'lo',
        '-m', 'owner', '--uid-owner', uid, '-j', 'MARK', '--set-mark', OUTBOUND_MARK);
    }
    for (const gid of cfg.proxyGID) {
      b.appendVersionedRule(loopV4, '::1/128', 'OUTPUT', 'mangle', '!', '-d', V, '-p', 'tcp', '-o', 'lo',
        '-m', 'owner', '--gid-owner', gid, '-j', 'MARK', '--set-mark', OUTBOUND_MARK);
    }
    b.appendRule('OUTPUT', 'mangle', '-p', 'tcp', '-m', 'connmark', '--mark', mark, '-j', 'CONNMARK', '--restore-mark');
    b.insertRule(ISTIO_INBOUND, 'mangle', 1, '-p', 'tcp', '-m', 'mark', '--mark', mark, '-j', 'RETURN');
    b.insertRuleV4(ISTIO_INBOUND, 'mangle', 2, '-p', 'tcp', '-s', '127.0.0.6/32', '-i', 'lo', '-j', 'RETURN');
    b.insertRuleV6(ISTIO_INBOUND, 'mangle', 2, '-p', 'tcp', '-s', '::6/128', '-i', 'lo', '-j', 'RETURN');
    b.insertRule(ISTIO_INBOUND, 'mangle', 3, '-p', 'tcp', '-i', 'lo', '-m', 'mark', '!', '--mark', OUTBOUND_MARK, '-j', 'RETURN');
  }
  return b;
}

function handleInboundPortsInclude(b: IptablesRuleBuilder, cfg: CaptureConfig, tproxy: boolean): void {
  if (cfg.inboundPortsInclude === '') return;
  let table: string;
  if (tproxy) {
    b.appendRule(ISTIO_DIVERT, 'mangle', '-j', 'MARK', '--set-mark', cfg.inboundTProxyMark);
    b.appendRule(ISTIO_DIVERT, 'mangle', '-j', 'ACCEPT');
    b.appendVersionedRule(cfg.hostIPv4LoopbackCidr, '::1/128', ISTIO_TPROXY, 'mangle', '!', '-d', V, '-p', 'tcp',
      '-j', 'TPROXY', '--tproxy-mark', `${cfg.inboundTProxyMark}/0xffffffff`, '--on-port', cfg.inboundCapturePort);
    table = 'mangle';
  } else {
    table = 'nat';
  }
  b.appendRule('PREROUTING', table, '-p', 'tcp', '-j', ISTIO_INBOUND);
  if (cfg.inboundPortsInclude === '*') {
    for (const port of splitList(cfg.inboundPortsExclude)) {
      b.appendRule(ISTIO_INBOUND, table, '-p', 'tcp', '--dport', port, '-j', 'RETURN');
    }
    if (tproxy) {
      b.appendRule(ISTIO_INBOUND, 'mangle', '-p', 'tcp', '-m', 'conntrack', '--ctstate', 'RELATED,ESTABLISHED', '-j', ISTIO_DIVERT);
      b.appendRule(ISTIO_INBOUND, 'mangle', '-p', 'tcp', '-j', ISTIO_TPROXY);
    } else {
      b.appendRule(ISTIO_INBOUND, 'nat', '-p', 'tcp', '-j', ISTIO_IN_REDIRECT);
    }
  } else {
    for (const port of splitList(cfg.inboundPortsInclude)) {
      if (tproxy) {
        b.appendRule(ISTIO_INBOUND, 'mangle', '-p', 'tcp', '--dport', port, '-m', 'conntrack', '--ctstate', 'RELATED,ESTABLISHED', '-j', ISTIO_DIVERT);
        b.appendRule(ISTIO_INBOUND, 'mangle', '-p', 'tcp', '--dport', port, '-j', ISTIO_TPROXY);
      } else {
        b.appendRule(ISTIO_INBOUND, 'nat', '-p', 'tcp', '--dport', port, '-j', ISTIO_IN_REDIRECT);
      }
    }
  }
}

/** SetupDNSRedir + addDNSConntrackZones */
function setupDNSRedir(b: IptablesRuleBuilder, cfg: CaptureConfig): void {
  const all = cfg.captureAllDNS;
  const v4 = cfg.dnsServersV4;
  const v6 = cfg.dnsServersV6;
  b.appendRule('OUTPUT', 'raw', '-j', ISTIO_OUTPUT_DNS);
  if (all || v4.length > 0) b.appendRuleV4(ISTIO_OUTPUT, 'nat', '-j', ISTIO_OUTPUT_DNS);
  if (all || v6.length > 0) b.appendRuleV6(ISTIO_OUTPUT, 'nat', '-j', ISTIO_OUTPUT_DNS);
  if (all) {
    b.appendRule(ISTIO_OUTPUT_DNS, 'nat', '-p', 'tcp', '--dport', '53', '-j', 'REDIRECT', '--to-ports', DNS_PORT);
  } else {
    for (const s of v4) b.appendRuleV4(ISTIO_OUTPUT_DNS, 'nat', '-p', 'tcp', '--dport', '53', '-d', `${s}/32`, '-j', 'REDIRECT', '--to-ports', DNS_PORT);
    for (const s of v6) b.appendRuleV6(ISTIO_OUTPUT_DNS, 'nat', '-p', 'tcp', '--dport', '53', '-d', `${s}/128`, '-j', 'REDIRECT', '--to-ports', DNS_PORT);
  }
  if (all) {
    b.appendRule(ISTIO_OUTPUT_DNS, 'nat', '-p', 'udp', '--dport', '53', '-j', 'REDIRECT', '--to-port', DNS_PORT);
  } else {
    for (const s of v4) b.appendRuleV4(ISTIO_OUTPUT_DNS, 'nat', '-p', 'udp', '--dport', '53', '-d', `${s}/32`, '-j', 'REDIRECT', '--to-port', DNS_PORT);
    for (const s of v6) b.appendRuleV6(ISTIO_OUTPUT_DNS, 'nat', '-p', 'udp', '--dport', '53', '-d', `${s}/128`, '-j', 'REDIRECT', '--to-port', DNS_PORT);
  }
  // Split UDP DNS into conntrack zones: proxy<->upstream is zone 1, app<->proxy zone 2.
  for (const uid of cfg.proxyUID) {
    b.appendRule(ISTIO_OUTPUT_DNS, 'raw', '-p', 'udp', '--dport', '53', '-m', 'owner', '--uid-owner', uid, '-j', 'CT', '--zone', '1');
    b.appendRule(ISTIO_OUTPUT_DNS, 'raw', '-p', 'udp', '--sport', DNS_PORT, '-m', 'owner', '--uid-owner', uid, '-j', 'CT', '--zone', '2');
  }
  for (const gid of cfg.proxyGID) {
    b.appendRule(ISTIO_OUTPUT_DNS, 'raw', '-p', 'udp', '--dport', '53', '-m', 'owner', '--gid-owner', gid, '-j', 'CT', '--zone', '1');
    b.appendRule(ISTIO_OUTPUT_DNS, 'raw', '-p', 'udp', '--sport', DNS_PORT, '-m', 'owner', '--gid-owner', gid, '-j', 'CT', '--zone', '2');
  }
  if (all) {
    b.appendRule('PREROUTING', 'raw', '-j', ISTIO_INBOUND);
    b.appendRule(ISTIO_OUTPUT_DNS, 'raw', '-p', 'udp', '--dport', '53', '-j', 'CT', '--zone', '2');
    b.appendRule(ISTIO_INBOUND, 'raw', '-p', 'udp', '--sport', '53', '-j', 'CT', '--zone', '1');
  } else {
    if (v4.length > 0) b.appendRuleV4('PREROUTING', 'raw', '-j', ISTIO_INBOUND);
    for (const s of v4) {
      b.appendRuleV4(ISTIO_OUTPUT_DNS, 'raw', '-p', 'udp', '--dport', '53', '-d', `${s}/32`, '-j', 'CT', '--zone', '2');
      b.appendRuleV4(ISTIO_INBOUND, 'raw', '-p', 'udp', '--sport', '53', '-s', `${s}/32`, '-j', 'CT', '--zone', '1');
    }
    if (v6.length > 0) b.appendRuleV6('PREROUTING', 'raw', '-j', ISTIO_INBOUND);
    for (const s of v6) {
      b.appendRuleV6(ISTIO_OUTPUT_DNS, 'raw', '-p', 'udp', '--dport', '53', '-d', `${s}/128`, '-j', 'CT', '--zone', '2');
      b.appendRuleV6(ISTIO_INBOUND, 'raw', '-p', 'udp', '--sport', '53', '-s', `${s}/128`, '-j', 'CT', '--zone', '1');
    }
  }
}

/** The iptables-restore input istio-iptables would feed for each family. */
export function renderIptables(cfg: CaptureConfig): RenderedRules {
  const b = buildIstioRules(cfg);
  return { v4: b.buildV4Restore(), v6: cfg.enableIPv6 ? b.buildV6Restore() : null };
}
