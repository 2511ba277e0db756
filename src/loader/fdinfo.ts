// /proc/self/fdinfo/<fd> says what a BPF fd is (link_type, prog_tag, map_type,
// ...) without needing an id->fd round trip: used to recognise our own pins.
import { readFileSync } from 'node:fs';

export function readFdinfo(fd: number): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8').split('\n')) {
    const i = line.indexOf(':');
    if (i > 0) out[line.slice(0, i).trim()] = line.slice(i + 1).trim();
  }
  return out;
}

export type BpfFdKind = 'link' | 'prog' | 'map' | 'unknown';

export function bpfFdKind(info: Record<string, string>): BpfFdKind {
  if ('link_type' in info) return 'link';
  if ('prog_tag' in info && 'prog_type' in info) return 'prog';
  if ('map_type' in info) return 'map';
  return 'unknown';
}
