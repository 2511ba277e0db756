// Real kernel, as root: apply / re-apply / check / remove in a test-made netns.
import { execa } from 'execa';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { parseIstioIptablesArgs } from '../../../src/redirect/flags.js';
import { applyCapture, checkCapture, detectVariant, removeCapture, type IptablesVariant } from '../../../src/fallback-iptables/apply.js';
import { deleteNetns, hostRules, inNs, makeNetns } from './netns.js';

const cfg = (flags: string[], enableIPv6 = false) =>
  parseIstioIptablesArgs(['-p', '15001', '-z', '15006', '-u', '1337', '-g', '1337', ...flags], { enableIPv6, lookupUser: () => undefined }).config;
const lockDir = `/tmp/meshcap-test-xtables-${process.pid}`;
const logger = pino({ level: 'silent' });

let ns: { name: string; path: string } | undefined;
let hostBefore = '';

beforeAll(async () => {
  expect(process.getuid?.()).toBe(0); // privileged tests must run as root; never skip silently
});

beforeEach(async () => {
  hostBefore = await hostRules();
  ns = await makeNetns('mc-ipt');
});

afterEach(async () => {
  if (ns) await deleteNetns(ns.name);
  ns = undefined;
  // The host's own rules are never touched.
  expect(await hostRules()).toBe(hostBefore);
});

afterAll(async () => {
  await execa('rm', ['-rf', lockDir], { reject: false });
});

const save = (bin: string) => inNs(ns!.name, bin, []);
const count = (text: string, line: string) => text.split('\n').filter((l) => l === line).length;

describe.each<[IptablesVariant]>([['nft'], ['legacy']])('iptables capture in a netns (%s)', (variant) => {
  const o = () => ({ forceVariant: variant, lockDir, logger });
  const saveBin = variant === 'nft' ? 'iptables-nft-save' : 'iptables-legacy-save';

  it('apply twice leaves exactly one copy and check passes', async () => {
    const c = cfg(['-i', '*', '-b', '*', '-d', '15020,15021,15090', '-o', '15020', '-c', 'eth9']);
    await applyCapture(ns!.path, c, o());
    await applyCapture(ns!.path, c, o());
    const live = await save(saveBin);
    expect(count(live, '-A OUTPUT -j ISTIO_OUTPUT')).toBe(1);
    expect(count(live, '-A PREROUTING -p tcp -j ISTIO_INBOUND')).toBe(1);
    expect(count(live, '-A PREROUTING -i eth9 -j RETURN')).toBe(1);
    expect(count(live, '-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001')).toBe(1);
    expect(await checkCapture(ns!.path, c, o())).toEqual({ ok: true, differences: [] });
  });

  it('re-apply with a changed config replaces the old rules atomically', async () => {
    await applyCapture(ns!.path, cfg(['-i', '*', '-o', '5555']), o());
    const c2 = cfg(['-i', '10.0.0.0/8']);
    await applyCapture(ns!.path, c2, o());
    const live = await save(saveBin);
    expect(live).not.toContain('5555');
    expect(await checkCapture(ns!.path, c2, o())).toEqual({ ok: true, differences: [] });
  });

  it('check names a rule deleted by hand', async () => {
    const c = cfg(['-i', '*']);
    await applyCapture(ns!.path, c, o());
    const bin = variant === 'nft' ? 'iptables-nft' : 'iptables-legacy';
    await inNs(ns!.name, bin, ['-t', 'nat', '-D', 'ISTIO_OUTPUT', '-d', '127.0.0.1/32', '-j', 'RETURN']);
    const r = await checkCapture(ns!.path, c, o());
    expect(r.ok).toBe(false);
    expect(r.differences).toEqual(['IPv4: missing rule: -t nat -A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN']);
  });

  it('remove deletes ISTIO_ chains and jumps only, leaving unrelated rules', async () => {
    const bin = variant === 'nft' ? 'iptables-nft' : 'iptables-legacy';
    await inNs(ns!.name, bin, ['-t', 'nat', '-A', 'OUTPUT', '-p', 'tcp', '--dport', '9999', '-j', 'RETURN']);
    await inNs(ns!.name, bin, ['-A', 'INPUT', '-p', 'tcp', '--dport', '9998', '-j', 'DROP']);
    const c = cfg(['-i', '*', '-b', '*', '-m', 'TPROXY', '--drop-invalid']);
    await applyCapture(ns!.path, c, o());
    await removeCapture(ns!.path, c, o());
    const live = await save(saveBin);
    expect(live).not.toContain('ISTIO_');
    expect(live).not.toContain('--mark 0x539');
    expect(live).toContain('-A OUTPUT -p tcp -m tcp --dport 9999 -j RETURN');
    expect(live).toContain('-A INPUT -p tcp -m tcp --dport 9998 -j DROP');
    // Without the config, remove still finds and drops chains + jumps.
    await applyCapture(ns!.path, cfg(['-i', '*']), o());
    await removeCapture(ns!.path, undefined, o());
    expect(await save(saveBin)).not.toContain('ISTIO_');
  });
});

describe('binary choice and routes', () => {
  it('detects legacy when legacy rules exist in the netns, else nft', async () => {
    expect(await detectVariant(ns!.path, 4, { lockDir, logger })).toBe('nft');
    await inNs(ns!.name, 'iptables-legacy', ['-A', 'INPUT', '-p', 'tcp', '--dport', '9997', '-j', 'ACCEPT']);
    expect(await detectVariant(ns!.path, 4, { lockDir, logger })).toBe('legacy');
    expect(await detectVariant(ns!.path, 4, { lockDir, logger, forceVariant: 'plain' })).toBe('plain');
  });

  it('TPROXY with IPv6 sets fwmark rules, table 133 local routes and ::6 on lo; remove clears them', async () => {
    const c = cfg(['-i', '*', '-b', '*', '-m', 'TPROXY'], true);
    await applyCapture(ns!.path, c, { lockDir, logger });
    await applyCapture(ns!.path, c, { lockDir, logger });
    const rules4 = await inNs(ns!.name, 'ip', ['-4', 'rule', 'show']);
    const rules6 = await inNs(ns!.name, 'ip', ['-6', 'rule', 'show']);
    expect(rules4.split('\n').filter((l) => l.includes('fwmark 0x539 lookup 133'))).toHaveLength(1);
    expect(rules6.split('\n').filter((l) => l.includes('fwmark 0x539 lookup 133'))).toHaveLength(1);
    expect(await inNs(ns!.name, 'ip', ['-4', 'route', 'show', 'table', '133'])).toContain('local default dev lo');
    expect(await inNs(ns!.name, 'ip', ['-6', 'route', 'show', 'table', '133'])).toContain('local default dev lo');
    expect(await inNs(ns!.name, 'ip', ['-6', 'addr', 'show', 'dev', 'lo'])).toContain('inet6 ::6/128');
    expect(await inNs(ns!.name, 'ip6tables-nft-save', [])).toContain('-A ISTIO_TPROXY ! -d ::1/128 -p tcp -j TPROXY --on-port 15006 --on-ip :: --tproxy-mark 0x539/0xffffffff');
    expect((await checkCapture(ns!.path, c, { lockDir, logger })).ok).toBe(true);
    await removeCapture(ns!.path, c, { lockDir, logger });
    expect(await inNs(ns!.name, 'ip', ['-4', 'rule', 'show'])).not.toContain('lookup 133');
    expect(await inNs(ns!.name, 'ip', ['-4', 'route', 'show', 'table', '133'])).toBe('');
    expect(await inNs(ns!.name, 'ip6tables-nft-save', [])).not.toContain('ISTIO_');
  });

  it('errors name the netns, the binary, the exit code and stderr', async () => {
    const err = await applyCapture('/var/run/netns/meshcap-does-not-exist', cfg(['-i', '*']), { lockDir, logger, forceVariant: 'nft' }).catch((e: Error) => e);
    expect(String(err)).toMatch(/iptables-nft-save in netns \/var\/run\/netns\/meshcap-does-not-exist failed \(exit code 1\): nsenter: .*No such file/);
  });
});
