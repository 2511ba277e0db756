// bench:inbound — what a meshed pod's inbound program costs, stub (issue 19:
// bpf/inbound-stub.bpf.c tail-calling the node's shared mc_inbound_main) against
// a whole mc_inbound per pod (bpf/inbound.bpf.c, before issue 19):
//   - load: wall and this process's CPU time (libuv thread included) per
//     program loaded, and the kernel's verified_insns / xlated size of each
//     (bpftool). Three ways: `template` (what the pool's refill and an ADD
//     do now: the stub's instructions from a template loaded once, a fresh
//     1-entry array in place of its .bss, one raw BPF_PROG_LOAD, the cookie
//     written into the array), `stub` (the stub object loaded through libbpf, as the
//     pool did before), `whole` (libbpf, as a pod gets where the kernel
//     refuses the shared program);
//   - per SYN: the program's own CPU per captured connection (kernel.bpf_stats_enabled
//     run_time_ns / run_cnt, the tail-called shared program included in the
//     stub's figure), one pod netns, connections from a client netns to a
//     captured port, a listener on 15006 that accepts and closes.
// Run as root: node --import ./bench/lib/ts.mjs bench/inbound/main.ts [--loads 200] [--conns 3000]
import { readFileSync, writeFileSync } from 'node:fs';
import { execa } from 'execa';
import * as bpf from '../../src/native/addon.js';
import { loadDatapath, uninstallDatapath } from '../../src/loader/datapath.js';
import { readFdinfo } from '../../src/loader/fdinfo.js';
import { INBOUND_STUB_OBJECT, INBOUND_STUB_PROGRAM, objectPath, pinLayout } from '../../src/loader/manifest.js';
import { cleanupOnSignals, Lab } from '../../src/lab/index.js';
import { loadInboundInstance, setInstanceNetns, StubTemplate, type InboundInstance } from '../../src/pod-datapath/inbound-pool.js';
import { EbpfBackend } from '../../src/pod-datapath/ebpf.js';
import { netnsCookie } from '../../src/pod-netns.js';
import { istioCapture } from '../../test/helpers/pods.js';
import { parseOptions } from '../../scripts/lib/cli-options.mjs';

const opt = parseOptions(import.meta.url, 'bench:inbound', { loads: { type: 'string', default: '200' }, conns: { type: 'string', default: '3000' } });
const LOADS = Number(opt.loads);
const CONNS = Number(opt.conns);
if (process.getuid?.() !== 0) throw new Error('run as root: the bench loads BPF programs and makes network namespaces');

const SYSCTL = '/proc/sys/kernel/bpf_stats_enabled';
const lab = new Lab('mcbin', String(process.pid));
const stop = cleanupOnSignals(() => lab.close(), (m) => process.stderr.write(`bench:inbound: ${m}\n`));
const pinRoot = `/sys/fs/bpf/meshcap-bench-inbound-${process.pid}`;
const L = pinLayout(pinRoot);
const loadavg = () => readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');

async function progJson(id: number): Promise<{ name: string; verified_insns?: number; bytes_xlated?: number; run_cnt?: number; run_time_ns?: number }> {
  return JSON.parse((await execa('bpftool', ['-j', 'prog', 'show', 'id', String(id)])).stdout);
}

/** The verifier's instruction count (fdinfo verified_insns, 5.16+; bpftool 7.1 does not show it). */
function verified(progFd: number): number | null {
  const v = readFdinfo(progFd).verified_insns;
  return v === undefined ? null : Number(v);
}

/** Hides the shared program's pin for the duration: the pool's loader then loads whole programs, as before issue 19. */
async function asWhole<T>(f: () => Promise<T>): Promise<T> {
  const pin = L.prog('mc_inbound_main');
  const fd = bpf.objGet(pin);
  (await import('node:fs')).unlinkSync(pin);
  try {
    return await f();
  } finally {
    bpf.objPin(fd, pin);
    bpf.closeFd(fd);
  }
}

/** The stub object loaded through libbpf, as the pool loaded stubs before the template. */
async function libbpfStub(): Promise<InboundInstance> {
  const obj = bpf.openObject(objectPath(INBOUND_STUB_OBJECT), { mapPinDir: L.maps });
  await obj.load();
  const fd = obj.programs().find((p) => p.name === INBOUND_STUB_PROGRAM)!.fd;
  return { kind: 'stub', progFd: fd, netnsMapFd: -1, mapId: 0, close: () => obj.close() };
}

/** What the pool's refill does (map create + raw load) and then the ADD (the cookie written). */
function templateStub(t: StubTemplate, netns: bigint): InboundInstance {
  const inst = t.instance();
  setInstanceNetns(inst, netns);
  return inst;
}

async function loadCost(kind: 'template' | 'stub' | 'whole') {
  const run = async () => {
    const insts: InboundInstance[] = [];
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    // template: the one libbpf load of the template is counted in (it is per datapath load, not per pod)
    const template = kind === 'template' ? new StubTemplate(L.maps) : undefined;
    for (let i = 0; i < LOADS; i++) insts.push(template ? templateStub(template, BigInt(i + 1)) : kind === 'stub' ? await libbpfStub() : await loadInboundInstance(L.maps, BigInt(i + 1)));
    const wall = (performance.now() - t0) / LOADS;
    const c = process.cpuUsage(c0);
    template?.close();
    if (insts[0]!.kind !== (kind === 'whole' ? 'whole' : 'stub')) throw new Error(`expected ${kind} programs, loaded ${insts[0]!.kind}`);
    const p = await progJson(bpf.progInfo(insts[0]!.progFd).id);
    const verifiedInsns = verified(insts[0]!.progFd);
    for (const i of insts) i.close();
    return { kind, wallMs: +wall.toFixed(3), cpuMs: +((c.user + c.system) / 1000 / LOADS).toFixed(3), verifiedInsns, xlatedBytes: p.bytes_xlated ?? null };
  };
  return kind === 'whole' ? asWhole(run) : run();
}

async function main() {
  lab.add('pin root', () => uninstallDatapath(pinRoot));
  const t0 = performance.now();
  const c0 = process.cpuUsage();
  const loaded = await loadDatapath({ pinRoot });
  const datapathMs = performance.now() - t0;
  const datapathCpuMs = (process.cpuUsage(c0).user + process.cpuUsage(c0).system) / 1000;
  if (!loaded.inbound) throw new Error(`the shared inbound program did not load: ${JSON.stringify(loaded.unavailable)}`);
  const shared = await progJson(loaded.inbound.progId);
  const sharedFd = bpf.objGet(loaded.inbound.pin);
  shared.verified_insns = verified(sharedFd) ?? undefined;
  bpf.closeFd(sharedFd);
  console.log(`load average ${loadavg()}; datapath load (node objects + shared inbound) ${datapathMs.toFixed(1)} ms wall, ${datapathCpuMs.toFixed(1)} ms CPU`);
  console.log(`shared mc_inbound_main: verified_insns ${shared.verified_insns ?? '?'}, xlated ${shared.bytes_xlated} B (verified once per datapath load)`);

  const loads = [];
  for (const kind of ['template', 'stub', 'whole', 'template', 'stub', 'whole'] as const) loads.push(await loadCost(kind));
  console.log(`\nper-pod program load, ${LOADS} each, sequential (load average ${loadavg()}):`);
  for (const r of loads) console.log(`  ${r.kind.padEnd(8)} wall ${r.wallMs} ms  CPU ${r.cpuMs} ms  verified_insns ${r.verifiedInsns ?? '?'}  xlated ${r.xlatedBytes} B`);

  // Per SYN: one pod, its link swapped between a stub and a whole program.
  const pod = await lab.netns('pod');
  const cli = await lab.netns('cli');
  await lab.link(pod.name, cli.name, { a4: ['198.18.70.1/24'], b4: ['198.18.70.2/24'] });
  const be = new EbpfBackend(pinRoot);
  lab.add('backend', () => be.close());
  const cookie = await netnsCookie(pod.path);
  await be.register({ netns: pod.path, netnsCookie: cookie, config: istioCapture({ ips: ['198.18.70.1'], ipv6: false }), podIPs: ['198.18.70.1'] });
  // the proxy's inbound listener: registered in mc_listen at listen() by sockops
  const py = 'import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(("0.0.0.0",15006))\ns.listen(4096)\nprint("ready",flush=True)\nwhile True:\n  c,_=s.accept()\n  c.close()\n';
  const listener = lab.start('listener', pod.name, ['python3', '-c', py]);
  await listener.waitFor(/ready/, 10_000);
  const client = `import socket,sys\nfor i in range(${CONNS}):\n  c=socket.create_connection(("198.18.70.1",8080),timeout=5)\n  c.close()\n`;

  const before = readFileSync(SYSCTL, 'utf8').trim();
  writeFileSync(SYSCTL, '1');
  lab.add(`kernel.bpf_stats_enabled=${before}`, () => writeFileSync(SYSCTL, before));
  const linkFd = bpf.objGet(L.podInbound(cookie));
  lab.add('link fd', () => bpf.closeFd(linkFd));
  const perSyn = [];
  for (const kind of ['stub', 'whole', 'stub', 'whole', 'stub', 'whole'] as const) {
    const inst = kind === 'whole' ? await asWhole(() => loadInboundInstance(L.maps, cookie)) : await loadInboundInstance(L.maps, cookie);
    bpf.linkUpdate(linkFd, inst.progFd);
    const id = bpf.progInfo(inst.progFd).id;
    const a = await progJson(id);
    await execa('ip', lab.argv(cli.name, ['python3', '-c', client]));
    const b = await progJson(id);
    const cnt = (b.run_cnt ?? 0) - (a.run_cnt ?? 0);
    perSyn.push({ kind, runs: cnt, nsPerRun: Math.round(((b.run_time_ns ?? 0) - (a.run_time_ns ?? 0)) / Math.max(cnt, 1)) });
    inst.close();
  }
  console.log(`\nsk_lookup CPU per run (kernel.bpf_stats_enabled), ${CONNS} captured connections each (load average ${loadavg()}):`);
  for (const r of perSyn) console.log(`  ${r.kind.padEnd(5)} ${r.nsPerRun} ns per run (${r.runs} runs)`);
  console.log(JSON.stringify({ loadavg: loadavg(), datapathMs, shared: { verifiedInsns: shared.verified_insns, xlatedBytes: shared.bytes_xlated }, loads, perSyn }));
}

try {
  await main();
} finally {
  await lab.close();
  stop();
}
