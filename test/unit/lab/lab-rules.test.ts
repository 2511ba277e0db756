// The lab's network-safety rules, without touching the kernel: only
// 198.18.0.0/15 and 2001:db8::/32 go on an interface, checked before any
// command runs; the argv that runs a command inside a namespace.
import { describe, expect, it } from 'vitest';
import { assertLabAddress, inNetns, vethCommands } from '../../../src/lab/index.js';

describe('lab addresses', () => {
  it('accepts 198.18.0.0/15 and 2001:db8::/32, prefix included', () => {
    for (const a of ['198.18.0.1/24', '198.19.255.254/32', '198.18.3.1', '2001:db8::2/64', '2001:db8:40::1/128']) expect(() => assertLabAddress(a)).not.toThrow();
  });

  it('refuses anything that could be routed off the lab', () => {
    for (const a of ['10.0.0.1/24', '198.17.255.255/32', '198.20.0.1/24', '127.0.0.1/8', '0.0.0.0/0', '198.18.0.1/8', 'fd00::1/64', '2001:db9::1/64', '2001:db8::1/16', 'eth0']) {
      expect(() => assertLabAddress(a), a).toThrow(/outside 198\.18\.0\.0\/15 and 2001:db8::\/32|not an IP address/);
    }
  });

  it('a veth with one bad address makes nothing: the check comes before the first command', () => {
    expect(() => vethCommands({ ns: 'a', ifname: 'x0', v4: ['198.18.1.1/24'] }, { ns: 'b', ifname: 'x1', v4: ['10.1.1.1/24'] })).toThrow(/10\.1\.1\.1/);
    expect(() => vethCommands({ ns: 'a', ifname: 'a-very-long-ifname' }, { ns: 'b', ifname: 'x1' })).toThrow(/IFNAMSIZ/);
  });

  it('a veth gets addresses and links up, never a route', () => {
    const cmds = vethCommands({ ns: 'a', ifname: 'x0', v4: ['198.18.1.2/24'], v6: ['2001:db8::2/64'] }, { ns: 'b', ifname: 'x1', v4: ['198.18.1.1/24'] });
    expect(cmds[0]).toEqual(['link', 'add', 'x0', 'netns', 'a', 'type', 'veth', 'peer', 'name', 'x1', 'netns', 'b']);
    expect(cmds).toContainEqual(['-n', 'a', '-6', 'addr', 'add', '2001:db8::2/64', 'dev', 'x0', 'nodad']);
    expect(cmds.some((c) => c.includes('route'))).toBe(false);
    // both ends in one namespace (the istio-diff peers)
    expect(vethCommands({ ns: 'a', ifname: 'eth0' }, { ns: 'a', ifname: 'peer0' })[0]).toEqual(['-n', 'a', 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'peer0']);
  });
});

describe('commands in a namespace', () => {
  it('pins the CPU, then drops to the uid with the ambient capabilities', () => {
    expect(inNetns('ns1', ['sleep', '1'])).toEqual(['netns', 'exec', 'ns1', 'sleep', '1']);
    expect(inNetns('ns1', ['x'], { uid: 1337, caps: ['net_admin'], cpu: '0' })).toEqual([
      'netns', 'exec', 'ns1', 'taskset', '-c', '0', 'setpriv', '--reuid=1337', '--regid=1337', '--clear-groups', '--inh-caps=+net_admin', '--ambient-caps=+net_admin', 'x',
    ]);
  });
});
