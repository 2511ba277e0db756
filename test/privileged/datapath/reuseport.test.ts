// A proxy whose inbound listener is a SO_REUSEPORT group (issue 16, item 6):
// every socket of the group is registered (eBPF mode: one mc_listen slot
// each), so inbound keeps working when any one of them closes, the last one
// registered included, without waiting for the agent's self-check. Same
// expectations in iptables mode, where REDIRECT to 15006 meets the group.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { describeModes, makeDriver, type Driver } from '../../helpers/datapaths.js';
import { Lab, scaled, type NsAgent } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';

const POD = '198.18.26.1';
const CLIENT = '198.18.26.2';

// A stand-in proxy socket: answers every connection with its name.
const LISTENER = `
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind(("0.0.0.0", 15006))
s.listen(64)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[1].encode())
    c.close()
`;

describeModes('a SO_REUSEPORT inbound listener group, %s mode', (mode) => {
  const lab = new Lab();
  let dp: Driver;
  let client: NsAgent;
  let pod: { name: string; path: string };
  const listeners = new Map<string, ReturnType<Lab['spawn']>>();

  async function startListener(name: string): Promise<void> {
    const l = lab.spawn(pod.name, ['/usr/bin/python3', '-c', LISTENER, name], { uid: 1337, until: /^ready$/ });
    await l.ready;
    listeners.set(name, l);
  }

  /** Who answered `n` inbound connections to the app port. */
  async function answers(n: number): Promise<Set<string>> {
    const who = new Set<string>();
    for (let i = 0; i < n; i++) who.add((await client.connect(POD, 8080, '')).data);
    return who;
  }

  beforeAll(async () => {
    dp = await makeDriver(mode);
    pod = await lab.netns('rp');
    const cl = await lab.netns('rpcl');
    await lab.link(pod.name, cl.name, { a4: [`${POD}/24`], b4: [`${CLIENT}/24`] });
    client = await lab.agent(cl.name);
    await dp.register(pod.path, istioCapture({ ips: [POD], ipv6: false }), [POD]);
    // As a pod starts: capture first, then the proxy's sockets listen.
    await startListener('A');
    await startListener('B');
  }, scaled(120_000));

  afterAll(async () => {
    await dp?.close();
    await lab.cleanup();
  });

  it('inbound reaches the group', async () => {
    const who = await answers(30);
    expect([...who].every((w) => w === 'A' || w === 'B'), [...who].join(',')).toBe(true);
  });

  it('the last socket registered closes: the other one takes every connection', async () => {
    listeners.get('B')!.proc.kill('SIGKILL');
    await listeners.get('B')!.proc;
    expect([...(await answers(20))]).toEqual(['A']);
  });

  it('a new socket joins; then the first one closes: still served', async () => {
    await startListener('C');
    listeners.get('A')!.proc.kill('SIGKILL');
    await listeners.get('A')!.proc;
    expect([...(await answers(20))]).toEqual(['C']);
  });
});
