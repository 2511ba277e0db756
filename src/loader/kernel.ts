// Kernel release strings -> comparable versions ("5.10.0-28-amd64" -> 5.10.0).
export interface KernelVersion {
  major: number;
  minor: number;
  patch: number;
}

export function parseKernelRelease(release: string): KernelVersion {
  const m = /^(\d+)\.(\d+)(?:\.(\d+))?/.exec(release.trim());
  if (!m) throw new Error(`cannot parse kernel release "${release}"`);
  return { major: Number(m[1]), minor: Number(m[2]), patch: Number(m[3] ?? 0) };
}

export function kernelAtLeast(v: KernelVersion, major: number, minor: number): boolean {
  return v.major > major || (v.major === major && v.minor >= minor);
}

export function formatVersion(v: KernelVersion): string {
  return `${v.major}.${v.minor}`;
}
