// `meshcap load` and `meshcap uninstall`.
import { Option, type Command } from 'commander';
import { DEFAULT_PIN_ROOT } from '../paths.js';
import { loadDatapath, uninstallDatapath } from '../loader/datapath.js';
import { probeKernel } from '../loader/probe.js';
import type { ModeRequest } from '../loader/mode.js';

export const pinRootOption = () => new Option('--pin-root <dir>', 'bpffs directory for meshcap\'s pins').default(DEFAULT_PIN_ROOT);
export const modeOption = () => new Option('--mode <mode>', 'datapath mode').choices(['auto', 'ebpf', 'iptables']).default('auto');

export function registerDatapathCommands(program: Command): void {
  program
    .command('load')
    .description('load and attach the eBPF datapath (adopts what is already pinned)')
    .addOption(pinRootOption())
    .addOption(modeOption())
    .option('--no-splice', 'do not splice app<->proxy sockets with sk_msg (on by default: docs/bench-datapath.md)')
    .action(async (o: { pinRoot: string; mode: ModeRequest; splice: boolean }) => {
      const probe = await probeKernel(o.mode);
      if (probe.mode !== 'ebpf') {
        console.log(`mode iptables: nothing to load into the kernel (${probe.reasons.join('; ')})`);
        return;
      }
      const r = await loadDatapath({ pinRoot: o.pinRoot, splice: o.splice });
      for (const l of r.links) console.log(`${l.action.padEnd(8)} ${l.name.padEnd(14)} link ${l.linkId} prog ${l.progId} -> ${l.pin}`);
      for (const m of r.mapPrograms) console.log(`attached ${m.name.padEnd(14)} prog ${m.progId} -> map ${m.map}`);
      console.log(`datapath loaded at ${r.cgroup} (pins under ${r.pinRoot})`);
    });

  program
    .command('uninstall')
    .description('detach and remove every program, link, map and pin meshcap made')
    .addOption(pinRootOption())
    .action((o: { pinRoot: string }) => {
      const r = uninstallDatapath(o.pinRoot);
      console.log(`detached ${r.detached.length} links, removed ${r.unpinned.length} pins under ${o.pinRoot}`);
      if (r.leftBehind.length) {
        console.error(`left in place (not meshcap's): ${r.leftBehind.join(', ')}`);
        process.exitCode = 1;
      }
    });
}
