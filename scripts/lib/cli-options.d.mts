// Types of cli-options.mjs for the TypeScript scripts (bench/).
import type { ParseArgsConfig, parseArgs } from 'node:util';
export function headerOf(text: string): string;
export function parseOptions<const O extends NonNullable<ParseArgsConfig['options']>>(
  scriptUrl: string,
  name: string,
  options: O,
  argv?: string[],
): ReturnType<typeof parseArgs<{ options: O; strict: true; allowPositionals: false }>>['values'];
