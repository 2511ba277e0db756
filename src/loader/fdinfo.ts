// /proc/self/fdinfo/<fd> says what a BPF fd is (link_type, prog_tag, map_type,
// ...) without needing an id->fd round trip: used to recognise our own pins.
import { closeSync, openSync, readSync } from 'node:fs';

// readFileSync on a /proc file (stat size 0) reads into a fresh 64 KiB
// Buffer: malloc'd memory held until V8 collects it, on every pod DEL. A BPF
// fd's fdinfo is a few hundred bytes; one buffer serves every call.
let buf = Buffer.allocUnsafeSlow(4096);

export function readFdinfo(fd: number): Record<string, string> {
  const f = openSync(`/proc/self/fdinfo/${fd}`, 'r');
  let n = 0;
  try {
    for (;;) {
      const got = readSync(f, buf, n, buf.length - n, null);
      if (got === 0) break;
      n += got;
      if (n === buf.length) {
        const bigger = Buffer.allocUnsafeSlow(buf.length * 2);
        buf.copy(bigger);
        buf = bigger;
      }
    }
  } finally {
    closeSync(f);
  }
  const out: Record<string, string> = {};
  for (const line of buf.toString('utf8', 0, n).split('\n')) {
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
