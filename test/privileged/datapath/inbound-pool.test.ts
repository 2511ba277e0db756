// The agent's pool of pod inbound programs (src/pod-datapath/inbound-pool.ts):
// a meshed pod gets a stub the pool made ahead from its template (its cookie
// written into the stub's own 1-entry array at ADD), which captures exactly as
// one loaded for it; two pods' stubs each read their own cookie (each pod's
// own config decides); the template and the waiting stubs are attached and
// pinned nowhere and are gone from the kernel once the pool closes; a pod's link pinned by an older meshcap (netns cookie as a .rodata
// constant) is adopted as it is.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import * as bpf from '../../../src/native/addon.js';
import { loadDatapath, uninstallDatapath } from '../../../src/loader/datapath.js';
import { INBOUND_STUB_PROGRAM, INBOUND_TAIL_MAP, pinLayout, POD_INBOUND_PROGRAM } from '../../../src/loader/manifest.js';
import { EbpfBackend } from '../../../src/pod-datapath/ebpf.js';
import { netnsCookie } from '../../../src/pod-netns.js';
import { u64Key } from '../../../src/maps/layout.js';
import { Lab, scaled, testPinRoot, type NsAgent } from '../../helpers/lab.js';
import { istioCapture } from '../../helpers/pods.js';
import { describeEbpf } from '../../helpers/datapaths.js';

const projectRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

/** Whether the kernel still has a program with this id. */
async function progExists(id: number): Promise<boolean> {
  const r = await execa('bpftool', ['prog', 'show', 'id', String(id)], { reject: false });
  return r.exitCode === 0;
}

/** Programs are freed after an RCU grace period: poll briefly. */
async function progGone(id: number, ms = 5000): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (!(await progExists(id))) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return false;
}

describeEbpf('pod inbound program pool', () => {
  const lab = new Lab();
  const pinRoot = testPinRoot();
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'meshcap-inbound-pool-'));
  let be: EbpfBackend | undefined;
  let client: NsAgent;
  let proxies: Awaited<ReturnType<Lab['proxy']>>[] = [];
  const pods: { name: string; path: string; ip: string }[] = [];

  beforeAll(async () => {
    await loadDatapath({ pinRoot });
    const cl = await lab.netns('plcli');
    for (let i = 0; i < 4; i++) {
      const p = await lab.netns(`plpod${i}`);
      const ip = `198.18.${40 + i}.1`;
      await lab.link(p.name, cl.name, { a4: [`${ip}/24`], b4: [`198.18.${40 + i}.2/24`] });
      const app = await lab.agent(p.name);
      await app.listen('0.0.0.0', 8080);
      if (i === 3) await app.listen('0.0.0.0', 8081);
      pods.push({ ...p, ip });
    }
    client = await lab.agent(cl.name);
  }, scaled(120_000));

  afterAll(async () => {
    await lab.cleanup();
    be?.close();
    uninstallDatapath(pinRoot);
    rmSync(tmp, { recursive: true, force: true });
  });

  const inbound = (i: number) => proxies[i]!.accepts().filter((a) => a.listener === 'inbound').map((a) => a.orig);

  const linkedProg = (cookie: bigint) => {
    const fd = bpf.objGet(pinLayout(pinRoot).podInbound(cookie));
    try {
      return bpf.linkInfo(fd).progId;
    } finally {
      bpf.closeFd(fd);
    }
  };

  /** The cookie a stub reads: the value of its own mc_stub_netns array (bpftool). */
  const stubCookie = async (progId: number): Promise<bigint> => {
    const fd = bpf.progGetFdById(progId);
    let ids: number[];
    try {
      ids = bpf.progMapIds(fd);
    } finally {
      bpf.closeFd(fd);
    }
    for (const id of ids) {
      const m = JSON.parse((await execa('bpftool', ['-j', 'map', 'show', 'id', String(id)])).stdout) as { name: string };
      if (m.name !== 'mc_stub_netns') continue;
      const d = JSON.parse((await execa('bpftool', ['-j', 'map', 'dump', 'id', String(id)])).stdout) as { value: string[] }[];
      return Buffer.from(d[0]!.value.map((h) => parseInt(h, 16))).readBigUInt64LE();
    }
    throw new Error(`program ${progId} has no mc_stub_netns`);
  };

  it('hands a meshed pod a stub loaded ahead from its template, its cookie written at ADD, which captures its inbound', async () => {
    be = new EbpfBackend(pinRoot, { inboundPool: 2 });
    const pool = be.inboundPool!;
    await pool.filled();
    expect(pool.available).toBe(2);
    expect(pool.counts.templates).toBe(1);
    const template = pool.templateProgId()!;
    expect(await progExists(template)).toBe(true);
    const waiting = pool.programIds();
    expect(waiting).toHaveLength(3);
    // waiting stubs read 0: linked by mistake, they would capture nothing
    for (const id of waiting.filter((i) => i !== template)) expect(await stubCookie(id)).toBe(0n);
    // nothing of the template or the waiting stubs is pinned under the pin root
    expect(readdirSync(pinLayout(pinRoot).pods)).toEqual([]);

    const pod = pods[0]!;
    const cookie = await be.register({ netns: pod.path, config: istioCapture({ ips: [pod.ip], ipv6: false }), podIPs: [pod.ip] });
    expect(pool.counts.stubs).toBe(1);
    expect(pool.counts.hits).toBe(1);
    expect(waiting, 'the linked stub is one of those loaded ahead').toContain(linkedProg(cookie));
    expect(await stubCookie(linkedProg(cookie))).toBe(cookie);

    proxies[0] = await lab.proxy(pod.name);
    expect((await client.connect(pod.ip, 8080, 'pooled')).data).toBe(`${pod.ip}:8080|pooled`);
    expect(inbound(0)).toEqual([`${pod.ip}:8080`]);
    expect(be.stats(cookie)!.inbound).toBe(1n);
    expect(pool.counts.templates, 'the template is reused while the prog array stays').toBe(1);
  }, scaled(60_000));

  it('an empty pool makes the ADD load its own instance, which captures the same', async () => {
    const pool = be!.inboundPool!;
    pool.close(); // closed: take() finds nothing and loads nothing
    const pod = pods[1]!;
    const cookie = await be!.register({ netns: pod.path, config: istioCapture({ ips: [pod.ip], ipv6: false }), podIPs: [pod.ip] });
    expect(pool.counts.stubs).toBe(1);
    proxies[1] = await lab.proxy(pod.name);
    expect((await client.connect(pod.ip, 8080, 'own')).data).toBe(`${pod.ip}:8080|own`);
    expect(inbound(1)).toEqual([`${pod.ip}:8080`]);
    expect(be!.checkEntries(cookie, istioCapture({ ips: [pod.ip], ipv6: false }), [pod.ip])).toEqual([]);
  }, scaled(60_000));

  it('two pods\' stubs carry their own cookies: each pod\'s own config decides, capture goes to its own proxy', async () => {
    const pod = pods[3]!;
    // captured: 8080; not: 8081 (pod 0 captures every port, so pod 0's cookie here would capture 8081;
    // a cookie of no pod captures nothing, so 8080 would reach the app directly)
    const cfg = istioCapture({ ips: [pod.ip], ipv6: false, annotations: { 'traffic.sidecar.istio.io/excludeInboundPorts': '8081' } });
    const cookie = await be!.register({ netns: pod.path, config: cfg, podIPs: [pod.ip] });
    const cookie0 = await netnsCookie(pods[0]!.path);
    const [p0, p3] = [linkedProg(cookie0), linkedProg(cookie)].map((id) => {
      const fd = bpf.progGetFdById(id);
      try {
        return bpf.progInfo(fd);
      } finally {
        bpf.closeFd(fd);
      }
    });
    expect(p3!.name).toBe(p0!.name);
    expect(p3!.id).not.toBe(p0!.id);
    expect([await stubCookie(p0!.id), await stubCookie(p3!.id)], 'each stub reads its own array').toEqual([cookie0, cookie]);
    proxies[3] = await lab.proxy(pod.name);
    expect((await client.connect(pod.ip, 8080, 'own')).data).toBe(`${pod.ip}:8080|own`);
    expect((await client.connect(pod.ip, 8081, 'excluded')).data).toBe(`${pod.ip}:8081|excluded`);
    expect(inbound(3)).toEqual([`${pod.ip}:8080`]);
    expect((await client.connect(pods[0]!.ip, 8080, 'zero')).data).toBe(`${pods[0]!.ip}:8080|zero`);
    expect(inbound(0).at(-1)).toBe(`${pods[0]!.ip}:8080`);
    expect(inbound(3), 'pod 0\'s connection went to pod 0\'s proxy only').toHaveLength(1);
    be!.remove(cookie);
  }, scaled(60_000));

  it('closing the backend frees the template and the waiting stubs; pods keep their capture', async () => {
    const other = new EbpfBackend(pinRoot, { inboundPool: 3 });
    await other.inboundPool!.filled();
    const waiting = other.inboundPool!.programIds();
    expect(waiting, 'three stubs and the template').toHaveLength(4);
    other.close();
    for (const id of waiting) expect(await progGone(id), `program ${id} of the closed pool is still loaded`).toBe(true);
    // the pods' links hold their own instances
    expect((await client.connect(pods[0]!.ip, 8080, 'after-close')).data).toBe(`${pods[0]!.ip}:8080|after-close`);
    expect(inbound(0).at(-1)).toBe(`${pods[0]!.ip}:8080`);
  }, scaled(60_000));

  it('a pod\'s pinned link shows its netns live without a lookup; a different or deleted netns is not shown', async () => {
    const pod = pods[0]!;
    const cookie = await netnsCookie(pod.path);
    expect(be!.netnsShownLive(pod.path, cookie)).toBe(true);
    expect(be!.netnsShownLive(pods[1]!.path, cookie), 'another netns at the path').toBe(false);
    expect(be!.netnsShownLive(pod.path, cookie + 1n), 'no link for that cookie').toBe(false);
    const gone = await lab.netns('plgone');
    const goneCookie = await be!.register({ netns: gone.path, config: istioCapture({ ips: ['198.18.49.1'], ipv6: false }), podIPs: ['198.18.49.1'] });
    expect(be!.netnsShownLive(gone.path, goneCookie)).toBe(true);
    // A pinned object that is not a link, where a pod's link would be: never a proof.
    const notLink = (1n << 62n) + 7n; // netns cookies count up from 1: no netns has it
    const notLinkPin = pinLayout(pinRoot).podInbound(notLink);
    const mapFd = bpf.objGet(path.join(pinLayout(pinRoot).maps, 'mc_pods'));
    try {
      mkdirSync(path.dirname(notLinkPin), { recursive: true });
      bpf.objPin(mapFd, notLinkPin);
    } finally {
      bpf.closeFd(mapFd);
    }
    try {
      // the batch forms, on the JS thread and on a worker, give the one-by-one answers
      const asked = [
        { netnsPath: pod.path, netns: cookie },
        { netnsPath: pods[1]!.path, netns: cookie },
        { netnsPath: pod.path, netns: cookie + 1n },
        { netnsPath: gone.path, netns: goneCookie },
        { netnsPath: pod.path, netns: notLink },
      ];
      expect(be!.netnsShownLiveMany(asked)).toEqual([true, false, false, true, false]);
      expect(await be!.netnsShownLiveManyAsync(asked)).toEqual([true, false, false, true, false]);
      expect(await be!.netnsShownLiveManyAsync([])).toEqual([]);
      expect(() => bpf.linksProveNetnsAsync(['a'], []), 'pins and paths of other lengths').toThrow(/1 pins but 0 netns paths/);
    } finally {
      rmSync(path.dirname(notLinkPin), { recursive: true, force: true });
    }
    await execa('ip', ['netns', 'del', gone.name]);
    // the link stays pinned; its netns path is gone (and the link reports inode 0 once the netns is cleaned up)
    expect(existsSync(pinLayout(pinRoot).podInbound(goneCookie))).toBe(true);
    expect(be!.netnsShownLive(gone.path, goneCookie)).toBe(false);
    be!.remove(goneCookie);
  }, scaled(60_000));

  it('adopts a pod link pinned by an older meshcap (cookie as a .rodata constant) and removes it on DEL', async () => {
    // The previous build of bpf/inbound.bpf.c: the same program with the cookie a load-time constant.
    const src = readFileSync(path.join(projectRoot, 'bpf/inbound.bpf.c'), 'utf8');
    const old = src.replace(/^volatile __u64 mc_netns = 0;$/m, 'const volatile __u64 mc_netns = 0;');
    expect(old).not.toBe(src);
    const srcPath = path.join(tmp, 'inbound-rodata.bpf.c');
    const objPath = path.join(tmp, 'inbound-rodata.bpf.o');
    writeFileSync(srcPath, old);
    await execa('clang', ['-target', 'bpf', '-O2', '-g', '-Wall', '-Werror', '-D__TARGET_ARCH_x86', '-I', path.join(projectRoot, 'bpf/include'), '-I', path.join(projectRoot, 'bpf'),
      '-I', path.join(projectRoot, 'build/bpf'), '-idirafter', '/usr/include/x86_64-linux-gnu', '-c', srcPath, '-o', objPath]);

    const pod = pods[2]!;
    const cookie = await netnsCookie(pod.path);
    const L = pinLayout(pinRoot);
    const obj = bpf.openObject(objPath, { mapPinDir: L.maps });
    let linkId: number;
    try {
      obj.setRodata('mc_netns', u64Key(cookie));
      await obj.load();
      const prog = obj.programs().find((p) => p.name === POD_INBOUND_PROGRAM)!;
      const fd = bpf.linkCreateNetns(prog.fd, pod.path, bpf.consts.attachType.SK_LOOKUP!);
      mkdirSync(L.podDir(cookie), { recursive: true });
      bpf.objPin(fd, L.podInbound(cookie));
      linkId = bpf.linkInfo(fd).id;
      bpf.closeFd(fd);
    } finally {
      obj.close();
    }

    const fresh = new EbpfBackend(pinRoot, { inboundPool: 1 });
    try {
      await fresh.inboundPool!.filled();
      const cfg = istioCapture({ ips: [pod.ip], ipv6: false });
      expect(await fresh.register({ netns: pod.path, config: cfg, podIPs: [pod.ip] })).toBe(cookie);
      expect(fresh.inboundPool!.counts.hits, 'the pinned link was replaced instead of adopted').toBe(0);
      const fd = bpf.objGet(L.podInbound(cookie));
      expect(bpf.linkInfo(fd).id).toBe(linkId);
      bpf.closeFd(fd);
      expect(await fresh.check({ netns: pod.path, config: cfg, podIPs: [pod.ip] }, cookie)).toEqual([]);

      proxies[2] = await lab.proxy(pod.name);
      expect((await client.connect(pod.ip, 8080, 'old')).data).toBe(`${pod.ip}:8080|old`);
      expect(inbound(2)).toEqual([`${pod.ip}:8080`]);

      fresh.remove(cookie);
      expect(existsSync(L.podDir(cookie))).toBe(false);
      expect((await client.connect(pod.ip, 8080, 'removed')).data).toBe(`${pod.ip}:8080|removed`);
      expect(inbound(2)).toEqual([`${pod.ip}:8080`]); // not captured any more
    } finally {
      fresh.close();
    }
  }, scaled(60_000));

  it('adopts a stub of the previous build (cookie an immediate); a new prog array moves it onto a new stub with its cookie and gives the pool a new template', async () => {
    const pod = pods[3]!; // removed above; its proxy still runs
    const cookie = await netnsCookie(pod.path);
    const L = pinLayout(pinRoot);
    // The previous build of bpf/inbound-stub.bpf.c: no .bss, the cookie an ld_imm64 immediate.
    const src = readFileSync(path.join(projectRoot, 'bpf/inbound-stub.bpf.c'), 'utf8');
    const old = src
      .replace(/^__u64 mc_stub_netns SEC\(".bss"\);$/m, '')
      .replace(/^\tnetns = \*\(volatile __u64 \*\)&mc_stub_netns;\n\tif \(!netns\)\n\t\treturn SK_PASS;$/m, `\tasm volatile("%0 = ${cookie} ll" : "=r"(netns));`);
    expect(old).not.toMatch(/&mc_stub_netns|SEC\("\.bss"\)/);
    expect(old).toContain(`${cookie} ll`);
    const srcPath = path.join(tmp, 'inbound-stub-imm.bpf.c');
    const objPath = path.join(tmp, 'inbound-stub-imm.bpf.o');
    writeFileSync(srcPath, old);
    await execa('clang', ['-target', 'bpf', '-O2', '-g', '-Wall', '-Werror', '-D__TARGET_ARCH_x86', '-I', path.join(projectRoot, 'bpf/include'), '-I', path.join(projectRoot, 'bpf'),
      '-I', path.join(projectRoot, 'build/bpf'), '-idirafter', '/usr/include/x86_64-linux-gnu', '-c', srcPath, '-o', objPath]);
    const obj = bpf.openObject(objPath, { mapPinDir: L.maps });
    let linkId: number;
    let oldProg: number;
    try {
      await obj.load();
      const prog = obj.programs().find((p) => p.name === INBOUND_STUB_PROGRAM)!;
      expect(obj.maps().some((m) => m.name.endsWith('.bss')), 'the old stub has no .bss').toBe(false);
      const fd = bpf.linkCreateNetns(prog.fd, pod.path, bpf.consts.attachType.SK_LOOKUP!);
      mkdirSync(L.podDir(cookie), { recursive: true });
      bpf.objPin(fd, L.podInbound(cookie));
      linkId = bpf.linkInfo(fd).id;
      oldProg = bpf.progInfo(prog.fd).id;
      bpf.closeFd(fd);
    } finally {
      obj.close();
    }

    const fresh = new EbpfBackend(pinRoot, { inboundPool: 2 });
    try {
      const pool = fresh.inboundPool!;
      await pool.filled();
      const cfg = istioCapture({ ips: [pod.ip], ipv6: false });
      expect(await fresh.register({ netns: pod.path, config: cfg, podIPs: [pod.ip] })).toBe(cookie);
      expect(pool.counts.stubs, 'the pinned link was replaced instead of adopted').toBe(0);
      expect(linkedProg(cookie)).toBe(oldProg);
      let n = inbound(3).length;
      expect((await client.connect(pod.ip, 8080, 'old-stub')).data).toBe(`${pod.ip}:8080|old-stub`);
      expect(inbound(3)).toHaveLength(n + 1);
      expect(inbound(3).at(-1)).toBe(`${pod.ip}:8080`);

      // A new prog array (its pin removed by hand, then a load): the old stub is moved onto a new stub, same link.
      const waiting = pool.programIds();
      expect(waiting).toHaveLength(3);
      unlinkSync(path.join(L.maps, INBOUND_TAIL_MAP));
      const back = await loadDatapath({ pinRoot });
      expect(back.inbound?.relinked, 'pods 0, 1 (stubs of this build) and 3 (the old stub)').toBe(3);
      const fd = bpf.objGet(L.podInbound(cookie));
      expect(bpf.linkInfo(fd).id).toBe(linkId);
      bpf.closeFd(fd);
      expect(linkedProg(cookie)).not.toBe(oldProg);
      expect(await stubCookie(linkedProg(cookie))).toBe(cookie);
      n = inbound(3).length;
      expect((await client.connect(pod.ip, 8080, 'moved')).data).toBe(`${pod.ip}:8080|moved`);
      expect(inbound(3)).toHaveLength(n + 1);

      // The pool's next ADD: a new template for the new array; the stubs it had waiting (old array) are freed.
      fresh.remove(cookie);
      expect(await fresh.register({ netns: pod.path, config: cfg, podIPs: [pod.ip] })).toBe(cookie);
      expect(pool.counts.templates).toBe(2);
      expect(pool.counts.stubs).toBe(1);
      for (const id of waiting) expect(await progGone(id), `program ${id} made for the replaced prog array is still loaded`).toBe(true);
      expect(await stubCookie(linkedProg(cookie))).toBe(cookie);
      n = inbound(3).length;
      expect((await client.connect(pod.ip, 8080, 'new-template')).data).toBe(`${pod.ip}:8080|new-template`);
      expect(inbound(3)).toHaveLength(n + 1);
      fresh.remove(cookie);
    } finally {
      fresh.close();
    }
  }, scaled(60_000));
});
