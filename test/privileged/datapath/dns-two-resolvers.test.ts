// Issue 16, item 10: one unconnected UDP socket with queries to two resolvers
// in flight. Under iptables each reply shows the resolver its query went to:
// the second query's flow clashes with the first on the reply tuple
// (127.0.0.1:15053 -> app:port), and conntrack's implicit source NAT gives it
// another source port, so the proxy's replies are told apart. eBPF mode
// cannot do that: sendmsg4/6 cannot change the source port, and recvmsg4/6
// see neither the payload (the DNS id) nor the datagram's local address, so
// mc_dnsorig keeps one resolver per socket: the last one asked. This test
// pins both behaviours (docs/datapath.md) so a change to either is seen.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { fileURLToPath } from 'node:url';
import { describeModes, makeDriver, type Driver } from '../../helpers/datapaths.js';
import { Lab, scaled } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

const SCRIPT = fileURLToPath(new URL('./dns_two_resolvers.py', import.meta.url));
const R1 = '198.18.37.53';
const R2 = '198.18.37.54';

describeModes('DNS replies on one socket with two resolvers in flight, %s mode', (mode) => {
  const lab = new Lab();
  let dp: Driver;
  let pod: { name: string; path: string };

  beforeAll(async () => {
    dp = await makeDriver(mode);
    pod = await lab.netns('dns2');
    const srv = await lab.netns('dns2srv');
    await lab.link(pod.name, srv.name, { a4: ['198.18.37.1/24'], b4: [`${R1}/24`, `${R2}/24`] });
    await lab.proxy(pod.name, ['--dns', '15053', '--no-ipv6']);
    await dp.register(pod.path, istioCapture({ ips: ['198.18.37.1'], proxyEnv: { ISTIO_META_DNS_CAPTURE: 'true' }, ipv6: false }), ['198.18.37.1']);
  }, scaled(60_000));

  afterAll(async () => {
    await lab.cleanup();
    await dp?.close();
  });

  it(mode === 'iptables' ? 'each reply shows its own query\'s resolver' : 'every reply shows the resolver the socket asked last (documented difference)', async () => {
    const r = await lab.exec(pod.name, ['/usr/bin/python3', SCRIPT, R1, R2]);
    const replies = JSON.parse(r.stdout) as [string, string][];
    const first = mode === 'iptables' ? `${R1}:53` : `${R2}:53`;
    expect(replies).toEqual([['q1', first], ['q2', `${R2}:53`], ['q3', `${R2}:53`]]);
  });
});
