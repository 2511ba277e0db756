// @ts-check
// Command-line options for meshcap's scripts (the benches, the kernel
// runner), on node:util's parseArgs: --help prints the script's own header
// comment, which is where each script describes itself and its options, and
// a bad option is one line on stderr and exit 2 rather than a stack trace.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

/**
 * The leading comment block of a script's source, without the comment
 * markers (a shebang and `// @ts-check` are left out).
 * @param {string} text
 */
export function headerOf(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (line.startsWith('#!') || /^\/\/\s*@ts-check\s*$/.test(line)) continue;
    if (!line.startsWith('//')) break;
    out.push(line.replace(/^\/\/ ?/, ''));
  }
  return out.join('\n');
}

/**
 * parseArgs(options) over argv, strict, no positionals; --help (or -h):
 * the script's header on stdout, exit 0; a bad option: `name: why` on
 * stderr, exit 2.
 * @template {NonNullable<import('node:util').ParseArgsConfig['options']>} O
 * @param {string} scriptUrl the script's import.meta.url
 * @param {string} name how the script is named in messages (bench:scale)
 * @param {O} options
 * @param {string[]} [argv]
 */
export function parseOptions(scriptUrl, name, options, argv = process.argv.slice(2)) {
  let parsed;
  try {
    parsed = parseArgs({ options: { ...options, help: { type: 'boolean', short: 'h' } }, args: argv, strict: true, allowPositionals: false });
  } catch (err) {
    process.stderr.write(`${name}: ${/** @type {Error} */ (err).message} (--help lists the options)\n`);
    process.exit(2);
  }
  if (parsed.values.help) {
    process.stdout.write(`${headerOf(readFileSync(fileURLToPath(scriptUrl), 'utf8'))}\n`);
    process.exit(0);
  }
  return parsed.values;
}
