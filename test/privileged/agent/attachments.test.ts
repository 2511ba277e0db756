// Attachments and namespaces the agent must treat specially: several CNI
// attachments of one pod netns (Multus: eth0 and net1 each run the chain)
// share one capture, which stays until the last of them is deleted; and the
// host's own network namespace is never registered as a pod.
import os from 'node:os';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { CniError } from '../../../src/cni/errors.js';
import { kernelAtLeast, parseKernelRelease } from '../../../src/loader/kernel.js';
import { netnsCookie } from '../../../src/pod-netns.js';
import { AgentFixture, cniRequest, podBesideServer } from '../../helpers/agent-fixture.js';
import { describeModes } from '../../helpers/datapaths.js';
import { Lab, scaled, type NsAgent } from '../../helpers/lab.js';
import { istioPod } from '../../helpers/pods.js';

describeModes('attachments of one netns, and the host netns, %s mode', (mode) => {
  const lab = new Lab();
  let fx: AgentFixture;
  let app: NsAgent;
  let proxy: Awaited<ReturnType<Lab['proxy']>>;
  let pod: { name: string; path: string };

  beforeAll(async () => {
    fx = new AgentFixture(mode, [istioPod({ name: 'multi' })]);
    ({ pod, app } = await podBesideServer(lab, 'att', { a4: ['198.18.41.1/24'], b4: ['198.18.41.2/24'] }, ['198.18.41.2']));
    await fx.start();
    proxy = await lab.proxy(pod.name);
  }, scaled(120_000));

  afterAll(async () => {
    await fx?.close();
    await lab.cleanup();
  });

  const req = (command: 'ADD' | 'DEL' | 'CHECK', ifname: string, netns = pod.path) =>
    cniRequest(command, { containerId: 'c-multi', netns, ifname, pod: 'multi', ips: ['198.18.41.1/24'] });

  async function viaProxy(tag: string): Promise<boolean> {
    const before = proxy.accepts().length;
    expect((await app.connect('198.18.41.2', 80, tag)).data).toBe(`198.18.41.2:80|${tag}`);
    await new Promise((r) => setTimeout(r, 50));
    return proxy.accepts().length > before;
  }

  it('DEL of one of two attachments of a netns leaves the pod captured; DEL of the last removes it', async () => {
    await fx.agent.handlers.add(req('ADD', 'eth0'));
    await fx.agent.handlers.add(req('ADD', 'net1'));
    expect(await viaProxy('both')).toBe(true);
    await fx.agent.handlers.del(req('DEL', 'net1'));
    expect(fx.agent.store.get('c-multi', 'net1')).toBeUndefined();
    await fx.agent.handlers.check(req('CHECK', 'eth0')); // throws if the capture went with net1
    expect(await viaProxy('one-left')).toBe(true);
    await fx.agent.handlers.del(req('DEL', 'eth0'));
    expect(await viaProxy('none-left')).toBe(false);
  });

  it('refuses the host\'s own network namespace with code 4, writing nothing', async () => {
    const hostNetns = '/proc/self/ns/net';
    let err: unknown;
    try {
      await fx.agent.handlers.add(req('ADD', 'eth0', hostNetns));
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(CniError);
    expect((err as CniError).code).toBe(4);
    expect((err as Error).message).toMatch(/default\/multi.*host's own network namespace/);
    expect(fx.agent.store.list()).toEqual([]);
    if (mode === 'ebpf') expect(fx.agent.ebpf!.pods()).not.toContain(await netnsCookie(hostNetns));
  });

  it('refuses by the cookie the forwarder sent: the host\'s cookie is the host, whatever the path', async () => {
    // The forwarder reads CNI_NETNS's cookie; the agent compares it with its
    // own instead of a stat of the path. A pod's path with the host's cookie
    // is refused, so the cookie is what decided.
    // SO_NETNS_COOKIE is Linux 5.14+: below it the forwarder sends no cookie,
    // so none can decide; the path does (the test above). Said, not skipped:
    const hostCookie = await netnsCookie('/proc/self/ns/net').catch((e: unknown) => {
      if ((e as { code?: string }).code === 'ENOPROTOOPT') return undefined;
      throw e;
    });
    if (hostCookie === undefined) {
      expect(kernelAtLeast(parseKernelRelease(os.release()), 5, 14), `no SO_NETNS_COOKIE on ${os.release()}`).toBe(false);
      console.log(`kernel ${os.release()} has no SO_NETNS_COOKIE: the forwarder sends no cookie, the path decides`);
      return;
    }
    let err: unknown;
    try {
      await fx.agent.handlers.add({ ...req('ADD', 'eth0'), netnsCookie: hostCookie });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(CniError);
    expect((err as CniError).code).toBe(4);
    expect((err as Error).message).toMatch(/host's own network namespace/);
    expect(fx.agent.store.list()).toEqual([]);
  });
});
