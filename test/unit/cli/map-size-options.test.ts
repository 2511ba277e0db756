// The map size options (the three LRU maps, mc_dstslot, mc_listen) of `meshcap load` and `meshcap agent`: validated
// before anything touches the kernel (exit 2 naming the option and the range),
// and the defaults are the sizes compiled into every object (meshcap.h).
import { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { registerAgentCommand } from '../../../src/cli/agent-command.js';
import { registerDatapathCommands } from '../../../src/cli/datapath-commands.js';
import { configureExits, runCli } from '../../../src/cli/exit.js';
import { DEFAULT_MAP_SIZES, MAX_MAP_ENTRIES, MIN_MAP_ENTRIES, parseMapEntries, SIZED_MAPS } from '../../../src/loader/map-sizes.js';
import { NODE_OBJECTS, objectPath, POD_INBOUND_OBJECT } from '../../../src/loader/manifest.js';
import * as bpf from '../../../src/native/addon.js';

async function run(argv: string[]) {
  let out = '';
  let err = '';
  const program = configureExits(new Command('meshcap')).configureOutput({ writeErr: (s) => (err += s), writeOut: (s) => (out += s) });
  registerDatapathCommands(program);
  registerAgentCommand(program);
  const code = await runCli(program, ['node', 'meshcap', ...argv], { err: (s) => (err += s) });
  return { out, err, code };
}

describe('LRU map size options', () => {
  it('accepts any integer in range, power of two or not', () => {
    expect(parseMapEntries('--origdst-entries', '100000')).toBe(100_000);
    expect(parseMapEntries('--origdst-entries', String(MIN_MAP_ENTRIES))).toBe(MIN_MAP_ENTRIES);
    expect(parseMapEntries('--origdst-entries', String(MAX_MAP_ENTRIES))).toBe(MAX_MAP_ENTRIES);
  });

  it.each(['0', '1023', String(MAX_MAP_ENTRIES + 1), '64k', '-5', '1e5', '', '65536.5'])('refuses %j naming the option and the range', (v) => {
    expect(() => parseMapEntries('--dnsorig-entries', v)).toThrow(`--dnsorig-entries ${JSON.stringify(v)} is not a number of entries between 1024 and 4194304`);
  });

  it.each([['load'], ['agent']])('meshcap %s: a bad size is a usage error (exit 2) before anything is loaded', async (cmd) => {
    const r = await run([cmd, '--pin-root', '/nonexistent/meshcap-unit', '--sockorig-entries', '12']);
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/--sockorig-entries "12" is not a number of entries between 1024 and 4194304/);
  });

  it.each([['load'], ['agent']])('meshcap %s --help lists the five options with their defaults', async (cmd) => {
    const r = await run([cmd, '--help']);
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/--origdst-entries <n>[\s\S]*\(default: "65536"\)/);
    expect(r.out).toMatch(/--sockorig-entries <n>[\s\S]*\(default: "16384"\)/);
    expect(r.out).toMatch(/--dnsorig-entries <n>[\s\S]*\(default: "65536"\)/);
    expect(r.out).toMatch(/--dstslot-entries <n>[\s\S]*\(default:\s+"65536"\)/);
    expect(r.out).toMatch(/--listen-entries <n>[\s\S]*\(default:\s+"65536"\)/);
  });

  it('the defaults are the sizes compiled into every object that carries the maps', () => {
    for (const file of [...NODE_OBJECTS.map((o) => o.file), POD_INBOUND_OBJECT]) {
      const obj = bpf.openObject(objectPath(file));
      try {
        const sizes = Object.fromEntries(obj.maps().filter((m) => (SIZED_MAPS as readonly string[]).includes(m.name)).map((m) => [m.name, m.maxEntries]));
        expect(sizes, file).toEqual(DEFAULT_MAP_SIZES);
      } finally {
        obj.close();
      }
    }
  });
});
