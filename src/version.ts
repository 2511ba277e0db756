// What meshcap is: the package version, and the git commit it was built from
// when the build knew it (scripts/build.mjs writes build/build-info.json; a
// tree without git, or never built, has no commit). Read once, no heavy
// imports: `meshcap version` and the agent's CNI replies use it.
import { readFileSync } from 'node:fs';

export interface MeshcapVersion {
  version: string;
  /** Full commit hash, or null when the build had no git. */
  commit: string | null;
  /** The working tree had uncommitted changes at build time. */
  dirty?: boolean;
}

let cached: MeshcapVersion | undefined;

function readJson(url: URL): Record<string, unknown> | undefined {
  try {
    const v = JSON.parse(readFileSync(url, 'utf8')) as unknown;
    return typeof v === 'object' && v !== null ? (v as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

/** dist/version.js and src/version.ts both sit one level under the package root. */
export function meshcapVersion(): MeshcapVersion {
  if (cached) return cached;
  const pkg = readJson(new URL('../package.json', import.meta.url));
  const info = readJson(new URL('../build/build-info.json', import.meta.url));
  const commit = typeof info?.commit === 'string' && /^[0-9a-f]{7,64}$/.test(info.commit) ? info.commit : null;
  cached = {
    version: typeof pkg?.version === 'string' ? pkg.version : 'unknown',
    commit,
    ...(commit && info?.dirty === true ? { dirty: true } : {}),
  };
  return cached;
}

/** "0.1.0 (commit 1a2b3c4d5e6f, dirty)" */
export function formatVersion(v: MeshcapVersion): string {
  if (!v.commit) return v.version;
  return `${v.version} (commit ${v.commit.slice(0, 12)}${v.dirty ? ', dirty' : ''})`;
}
