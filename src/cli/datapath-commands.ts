// `meshcap load` and `meshcap uninstall`.
import { existsSync, readdirSync, rmdirSync } from 'node:fs';
import path from 'node:path';
import { Option, type Command } from 'commander';
import { DEFAULT_PIN_ROOT } from '../paths.js';
import { configOf, cookieOf, DEFAULT_STATE_DIR, readRecords, StateStore, type AttachmentRecord } from '../agent/state-store.js';
import { pinLayout } from '../loader/manifest.js';
import { MAP } from '../maps/layout.js';
import type { ModeRequest } from '../loader/mode.js';
import { adoptedSizeMessage, DEFAULT_MAP_SIZES, MAP_SIZE_OPTION, mapSizesFromOptions, MAX_MAP_ENTRIES, MIN_MAP_ENTRIES, type MapSizes, type SizedMap } from '../loader/map-sizes.js';
import { UsageError } from './exit.js';
import { examples } from './help.js';
import { checkDirOption } from './preflight.js';
// The loader, the addon, the reconcile and pino are imported in the actions:
// `meshcap --help` loads none of them (test/unit/cli/startup-imports.test.ts).

export const pinRootOption = () => new Option('--pin-root <dir>', 'bpffs directory for meshcap\'s pins').default(DEFAULT_PIN_ROOT);
/**
 * --splice turned on the sk_msg splice, removed in issue 20. Still accepted
 * (hidden) so a DaemonSet or script that passes it keeps starting; it does
 * nothing and says so.
 */
export const removedSpliceOption = () => new Option('--splice', 'removed').hideHelp();
export const SPLICE_REMOVED = '--splice does nothing: the sk_msg splice was removed (issue 20; docs/datapath.md, "Why there is no splice"). Remove the flag';
export const modeOption = () => new Option('--mode <mode>', 'datapath mode').choices(['auto', 'ebpf', 'iptables']).default('auto');

const MAP_SIZE_HELP: Record<SizedMap, string> = {
  mc_origdst: 'mc_origdst entries: TCP connections between their SYN and the proxy side of the handshake',
  mc_sockorig: 'mc_sockorig entries: TCP connects inside connect()',
  mc_dnsorig: 'mc_dnsorig entries: UDP DNS sockets, the most recently used kept',
  mc_dstslot: 'mc_dstslot entries: (pod, destination) pairs with a loopback address of their own; once full, new destinations keep their original destination in socket storage',
  mc_listen: "mc_listen entries: meshed pods' proxy listening sockets (inbound port per family, outbound port on 0.0.0.0; one per SO_REUSEPORT socket, up to 4 per listener); a listener with no room gets no captured inbound connection",
};
/** One sized map's size (docs/datapath.md "Map sizes and memory"); applies when the map is created: a pinned map keeps its size. */
export const mapSizeOption = (name: SizedMap) =>
  new Option(`${MAP_SIZE_OPTION[name]} <n>`, `${MAP_SIZE_HELP[name]} (${MIN_MAP_ENTRIES}..${MAX_MAP_ENTRIES}; applies when the map is created)`).default(String(DEFAULT_MAP_SIZES[name]));
export interface MapSizeFlags { origdstEntries: string; sockorigEntries: string; dnsorigEntries: string; dstslotEntries: string; listenEntries: string }
/** Validated sizes, or a UsageError (exit code 2) naming the option. */
export function mapSizesOrUsage(o: MapSizeFlags): MapSizes {
  try {
    return mapSizesFromOptions(o);
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
}

export const stateDirOption = () => new Option('--state-dir <dir>', 'the agent\'s attachment records').default(DEFAULT_STATE_DIR);

/**
 * Restores every eBPF pod the agent recorded into the just-loaded maps: a
 * load that recreated a map would otherwise leave running pods uncaptured
 * until the agent's next pass. Returns lines to print; exit code 1 if any pod
 * could not be restored.
 */
async function restoreRecordedPods(pinRoot: string, stateDir: string): Promise<{ lines: string[]; failed: number }> {
  if (!existsSync(stateDir)) return { lines: [`no records in ${stateDir}: no pods to restore`], failed: 0 };
  const [{ pino }, { KeyedLock }, { reconcilePods, failedTrafficText }, { EbpfBackend }, { PodDatapath }] = await Promise.all([
    import('pino'), import('../agent/keyed-lock.js'), import('../agent/reconcile.js'),
    import('../pod-datapath/ebpf.js'), import('../pod-datapath/pod-datapath.js'),
  ]);
  const store = new StateStore(stateDir);
  const problems = store.open();
  const ebpf = new EbpfBackend(pinRoot);
  try {
    const logger = pino({ level: 'silent' });
    const r = await reconcilePods({
      store,
      datapath: new PodDatapath(ebpf, logger),
      nodeMode: 'ebpf',
      lock: new KeyedLock(),
      removeAttachment: () => Promise.reject(new Error('meshcap load removes no records (the agent does)')),
      logger,
    }, 'load');
    const lines = [`pods: ${r.records} recorded, ${r.restored} restored, ${r.failed} NOT restored, ${r.listenersRegistered} proxy listeners re-registered (${r.ms} ms)`];
    for (const p of r.pods) {
      if (p.outcome === 'restored') lines.push(`restored ${p.pod}: ${p.detail?.join('; ')}`);
      if (p.outcome === 'failed') lines.push(`NOT restored ${p.pod}: ${p.detail?.join('; ')} (${failedTrafficText(p)})`);
    }
    for (const p of problems) lines.push(`problem: ${p}`);
    return { lines, failed: r.failed };
  } finally {
    ebpf.close();
  }
}

/** Pods the eBPF datapath captures now: mc_pods entries, named from the records where possible. */
async function capturedPods(pinRoot: string, stateDir: string): Promise<string[]> {
  if (!existsSync(path.join(pinLayout(pinRoot).maps, MAP.pods))) return [];
  const { EbpfBackend } = await import('../pod-datapath/ebpf.js');
  const ebpf = new EbpfBackend(pinRoot);
  let cookies: bigint[];
  try {
    cookies = ebpf.pods();
  } finally {
    ebpf.close();
  }
  const byCookie = new Map(readRecords(stateDir).records.filter((r) => r.netnsCookie !== null).map((r) => [r.netnsCookie!, `${r.podNamespace}/${r.podName}`]));
  return cookies.map((c) => byCookie.get(c.toString()) ?? `(no record) netns cookie ${c}`);
}

/** iptables-mode records whose netns still lives: pods captured by rules meshcap put in their netns. */
async function iptablesPods(stateDir: string): Promise<AttachmentRecord[]> {
  const { liveCookie } = await import('../pod-netns.js');
  const out: AttachmentRecord[] = [];
  for (const r of readRecords(stateDir).records) {
    if (r.mode !== 'iptables') continue;
    const live = await liveCookie(r.netns);
    if (live === 'gone' || (live !== null && r.netnsCookie !== null && live.toString() !== r.netnsCookie)) continue;
    out.push(r);
  }
  return out;
}

/** --force: take meshcap's rules (and routes) out of each iptables pod's netns; other chains stay. */
async function removeIptablesCaptures(recs: AttachmentRecord[]): Promise<string[]> {
  const [{ pino }, { IptablesBackend }] = await Promise.all([import('pino'), import('../pod-datapath/iptables.js')]);
  const be = new IptablesBackend(pino({ level: 'silent' }));
  const failed: string[] = [];
  for (const r of recs) {
    const pod = `${r.podNamespace}/${r.podName}`;
    try {
      const outcome = await be.unregister({ netns: r.netns, config: configOf(r), podIPs: r.podIPs }, cookieOf(r));
      console.log(`${outcome === 'removed' ? 'removed the iptables capture of' : `nothing to remove (${outcome}) for`} ${pod} (netns ${r.netns})`);
    } catch (e) {
      failed.push(`${pod} (netns ${r.netns}): ${(e as Error).message}`);
    }
  }
  return failed;
}

/** --purge: every readable record removed; unreadable files (maybe not meshcap's) reported and left. */
async function purgeRecords(stateDir: string): Promise<void> {
  if (!existsSync(stateDir)) return;
  const store = new StateStore(stateDir);
  for (const p of store.open()) console.error(`left in place (unreadable, maybe not meshcap's): ${p}`);
  const recs = store.list();
  for (const r of recs) await store.remove(r.containerId, r.ifname);
  console.log(`removed ${recs.length} attachment records from ${stateDir}`);
  if (readdirSync(stateDir).length === 0) rmdirSync(stateDir);
}

/** The first pods of a list, for a one-line message (a node may have thousands; meshcap status lists them all). */
export function someOf(pods: readonly string[], n = 20): string {
  return pods.length > n ? `${pods.slice(0, n).join(', ')}, ... and ${pods.length - n} more (meshcap status lists them)` : pods.join(', ');
}

export function registerDatapathCommands(program: Command): void {
  program
    .command('load')
    .description('load and attach the eBPF datapath (adopts what is already pinned)')
    .addHelpText('after', examples(
      'sudo meshcap load',
      'sudo meshcap load --mode ebpf   # refuses, naming the missing hooks, where eBPF mode cannot run',
    ))
    .addOption(pinRootOption())
    .addOption(modeOption())
    .addOption(stateDirOption())
    .addOption(removedSpliceOption())
    .addOption(mapSizeOption('mc_origdst'))
    .addOption(mapSizeOption('mc_sockorig'))
    .addOption(mapSizeOption('mc_dnsorig'))
    .addOption(mapSizeOption('mc_dstslot'))
    .addOption(mapSizeOption('mc_listen'))
    .action(async (o: { pinRoot: string; mode: ModeRequest; splice?: boolean; stateDir: string } & MapSizeFlags) => {
      checkDirOption('--state-dir', o.stateDir);
      const mapSizes = mapSizesOrUsage(o);
      if (o.splice) console.error(`warning: ${SPLICE_REMOVED}`);
      const [{ probeKernel }, { loadDatapath }] = await Promise.all([import('../loader/probe.js'), import('../loader/datapath.js')]);
      const probe = await probeKernel(o.mode);
      if (probe.mode !== 'ebpf') {
        console.log(`mode iptables: nothing to load into the kernel (${probe.reasons.join('; ')})`);
        return;
      }
      const r = await loadDatapath({ pinRoot: o.pinRoot, mapSizes });
      for (const m of r.mapSizes) {
        if (m.maxEntries !== m.requested) console.log(`warning: ${adoptedSizeMessage(m)}`);
        else console.log(`map      ${m.name.padEnd(14)} ${m.maxEntries} entries${m.pinned ? ' (pinned)' : ''}`);
      }
      for (const l of r.links) console.log(`${l.action.padEnd(8)} ${l.name.padEnd(14)} link ${l.linkId} prog ${l.progId} -> ${l.pin}`);
      for (const p of r.removedLegacy) console.log(`removed  ${p} (an older meshcap's splice; connections still spliced keep it until they close)`);
      for (const u of r.unavailable) console.log(`unavailable ${u.file} (its feature is off on this kernel): ${u.reason}`);
      for (const w of r.orderWarnings) console.log(`warning: ${w}`);
      console.log(`datapath loaded at ${r.cgroup} (pins under ${r.pinRoot})`);
      const restored = await restoreRecordedPods(o.pinRoot, o.stateDir);
      for (const l of restored.lines) console.log(l);
      if (restored.failed > 0) process.exitCode = 1;
    });

  program
    .command('uninstall')
    .description('detach and remove every program, link, map and pin meshcap made')
    .addHelpText('after', examples(
      'sudo meshcap uninstall',
      'sudo meshcap uninstall --force   # even while meshed pods are captured',
      'sudo meshcap uninstall --force --purge   # the agent stopped: nothing of meshcap left, records included',
    ))
    .addOption(pinRootOption())
    .addOption(stateDirOption())
    .option('--force', 'uninstall even though meshed pods are captured now (their traffic then bypasses the sidecar); also takes meshcap\'s rules out of iptables-mode pods')
    .option('--purge', 'also remove the agent\'s attachment records (stop the agent first): an agent started later restores nothing')
    .action(async (o: { pinRoot: string; stateDir: string; force?: boolean; purge?: boolean }) => {
      checkDirOption('--state-dir', o.stateDir);
      const tables = await iptablesPods(o.stateDir);
      const live = [...await capturedPods(o.pinRoot, o.stateDir), ...tables.map((r) => `${r.podNamespace}/${r.podName} (iptables)`)];
      if (live.length > 0 && !o.force) {
        console.error(
          `meshcap uninstall: ${live.length} meshed pod(s) are captured by meshcap now: ${someOf(live)}.\n` +
            'Uninstalling detaches their capture: their connections would go straight to their destinations, past the sidecar (no mTLS, no policy), ' +
            'and inbound to them would be refused, until the agent loads the datapath again and restores them.\n' +
            'Drain the node (or delete those pods) first, or pass --force if that is what you want.',
        );
        process.exitCode = 1;
        return;
      }
      if (live.length > 0) console.error(`meshcap uninstall --force: ${live.length} meshed pod(s) lose their capture now: ${someOf(live)}`);
      const { uninstallDatapath } = await import('../loader/datapath.js');
      const r = uninstallDatapath(o.pinRoot);
      console.log(`detached ${r.detached.length} links, removed ${r.unpinned.length} pins under ${o.pinRoot}`);
      if (r.leftBehind.length) {
        console.error(`left in place (not meshcap's): ${r.leftBehind.join(', ')}`);
        process.exitCode = 1;
      }
      const failed = await removeIptablesCaptures(tables);
      for (const f of failed) console.error(`could not remove the iptables capture of ${f}`);
      if (failed.length) process.exitCode = 1;
      else if (o.purge) await purgeRecords(o.stateDir);
    });
}
