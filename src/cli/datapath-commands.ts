// `meshcap load` and `meshcap uninstall`.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { Option, type Command } from 'commander';
import { DEFAULT_PIN_ROOT } from '../paths.js';
import { DEFAULT_STATE_DIR, readRecords, StateStore } from '../agent/state-store.js';
import { pinLayout } from '../loader/manifest.js';
import { MAP } from '../maps/layout.js';
import type { ModeRequest } from '../loader/mode.js';
import { examples } from './help.js';
import { checkDirOption } from './preflight.js';
// The loader, the addon, the reconcile and pino are imported in the actions:
// `meshcap --help` loads none of them (test/unit/cli/startup-imports.test.ts).

export const pinRootOption = () => new Option('--pin-root <dir>', 'bpffs directory for meshcap\'s pins').default(DEFAULT_PIN_ROOT);
/** Why --splice is opt-in: said in every --help that offers it. */
export const SPLICE_WARNING = "experimental: FIONREAD under-reports on spliced sockets and a few connections are reset under a stalled proxy (issue 20), see docs/datapath.md";
export const modeOption = () => new Option('--mode <mode>', 'datapath mode').choices(['auto', 'ebpf', 'iptables']).default('auto');

export const stateDirOption = () => new Option('--state-dir <dir>', 'the agent\'s attachment records').default(DEFAULT_STATE_DIR);

/**
 * Restores every eBPF pod the agent recorded into the just-loaded maps: a
 * load that recreated a map would otherwise leave running pods uncaptured
 * until the agent's next pass. Returns lines to print; exit code 1 if any pod
 * could not be restored.
 */
async function restoreRecordedPods(pinRoot: string, stateDir: string): Promise<{ lines: string[]; failed: number }> {
  if (!existsSync(stateDir)) return { lines: [`no records in ${stateDir}: no pods to restore`], failed: 0 };
  const [{ pino }, { KeyedLock }, { reconcilePods }, { EbpfBackend }, { PodDatapath }] = await Promise.all([
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
      if (p.outcome === 'failed') lines.push(`NOT restored ${p.pod}: ${p.detail?.join('; ')} (its traffic may bypass the sidecar)`);
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
    .option('--splice', `splice app<->proxy sockets with sk_msg (off by default; ${SPLICE_WARNING})`)
    .action(async (o: { pinRoot: string; mode: ModeRequest; splice?: boolean; stateDir: string }) => {
      checkDirOption('--state-dir', o.stateDir);
      const [{ probeKernel }, { loadDatapath }] = await Promise.all([import('../loader/probe.js'), import('../loader/datapath.js')]);
      const probe = await probeKernel(o.mode);
      if (probe.mode !== 'ebpf') {
        console.log(`mode iptables: nothing to load into the kernel (${probe.reasons.join('; ')})`);
        return;
      }
      const r = await loadDatapath({ pinRoot: o.pinRoot, splice: o.splice === true });
      for (const l of r.links) console.log(`${l.action.padEnd(8)} ${l.name.padEnd(14)} link ${l.linkId} prog ${l.progId} -> ${l.pin}`);
      for (const m of r.mapPrograms) console.log(`attached ${m.name.padEnd(14)} prog ${m.progId} -> map ${m.map}`);
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
    ))
    .addOption(pinRootOption())
    .addOption(stateDirOption())
    .option('--force', 'uninstall even though meshed pods are captured now (their traffic then bypasses the sidecar)')
    .action(async (o: { pinRoot: string; stateDir: string; force?: boolean }) => {
      checkDirOption('--state-dir', o.stateDir);
      const live = await capturedPods(o.pinRoot, o.stateDir);
      if (live.length > 0 && !o.force) {
        console.error(
          `meshcap uninstall: ${live.length} meshed pod(s) are captured by the eBPF datapath now: ${live.slice(0, 20).join(', ')}${live.length > 20 ? ', ...' : ''}.\n` +
            'Uninstalling detaches their capture: their connections would go straight to their destinations, past the sidecar (no mTLS, no policy), ' +
            'and inbound to them would be refused, until the agent loads the datapath again and restores them.\n' +
            'Drain the node (or delete those pods) first, or pass --force if that is what you want.',
        );
        process.exitCode = 1;
        return;
      }
      if (live.length > 0) console.error(`meshcap uninstall --force: ${live.length} meshed pod(s) lose their capture now: ${live.join(', ')}`);
      const { uninstallDatapath } = await import('../loader/datapath.js');
      const r = uninstallDatapath(o.pinRoot);
      console.log(`detached ${r.detached.length} links, removed ${r.unpinned.length} pins under ${o.pinRoot}`);
      if (r.leftBehind.length) {
        console.error(`left in place (not meshcap's): ${r.leftBehind.join(', ')}`);
        process.exitCode = 1;
      }
    });
}
