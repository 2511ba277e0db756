// Version negotiation: which spec version a request speaks, and VERSION's answer.
import { CniError } from './errors.js';
import { CNI_ERROR_CODES, LATEST_VERSION, SUPPORTED_VERSIONS, VERB_MIN_VERSION, VERSION_PATTERN, type CniCommand, type CniVersion } from './rules.js';

export function isSupportedVersion(v: unknown): v is CniVersion {
  return typeof v === 'string' && (SUPPORTED_VERSIONS as readonly string[]).includes(v);
}

/** Semver order of two x.y.z versions; throws on anything else. */
export function compareVersions(a: string, b: string): number {
  const pa = VERSION_PATTERN.exec(a);
  const pb = VERSION_PATTERN.exec(b);
  if (!pa || !pb) throw new CniError(CNI_ERROR_CODES.DECODE_FAILURE, `cannot compare versions ${JSON.stringify(a)} and ${JSON.stringify(b)}`);
  for (let i = 1; i <= 3; i++) {
    const d = Number(pa[i]) - Number(pb[i]);
    if (d !== 0) return Math.sign(d);
  }
  return 0;
}

export interface VersionInfo {
  cniVersion: string;
  supportedVersions: CniVersion[];
}

/** VERSION's answer: echoes the requested version when supported. */
export function versionInfo(requested?: unknown): VersionInfo {
  return {
    cniVersion: isSupportedVersion(requested) ? requested : LATEST_VERSION,
    supportedVersions: [...SUPPORTED_VERSIONS],
  };
}

/** Picks the version to speak for a config: its cniVersion, which must be
 * supported and must have the verb. Throws CniError(1) otherwise. */
export function negotiateVersion(cniVersion: unknown, command: CniCommand): CniVersion {
  if (!isSupportedVersion(cniVersion)) {
    const shown = typeof cniVersion === 'string' ? cniVersion : '(missing)';
    throw new CniError(
      CNI_ERROR_CODES.INCOMPATIBLE_VERSION,
      `cniVersion ${shown} is not supported (supported: ${SUPPORTED_VERSIONS.join(', ')})`,
    );
  }
  const min = VERB_MIN_VERSION[command];
  if (compareVersions(cniVersion, min) < 0) {
    throw new CniError(
      CNI_ERROR_CODES.INCOMPATIBLE_VERSION,
      `config version ${cniVersion} does not allow ${command} (needs ${min} or later)`,
    );
  }
  return cniVersion;
}
