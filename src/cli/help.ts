// The "Examples:" block every command's --help ends with
// (test/unit/cli/help-examples.test.ts checks that each command has one).
export function examples(...lines: string[]): string {
  return ['', 'Examples:', ...lines.map((l) => `  ${l}`)].join('\n');
}
