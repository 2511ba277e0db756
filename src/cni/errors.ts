// The CNI error: what handlers throw, and the error object the runtime reads
// on stdout.
import { CNI_ERROR_CODES, LATEST_VERSION, VERSION_PATTERN } from './rules.js';

export type CniErrorCode = (typeof CNI_ERROR_CODES)[keyof typeof CNI_ERROR_CODES] | number;

export interface CniErrorResult {
  cniVersion: string;
  code: number;
  msg: string;
  details?: string;
}

/** A CNI error: what handlers throw, what the runtime reads on stdout. */
export class CniError extends Error {
  override readonly name = 'CniError';
  constructor(
    readonly code: CniErrorCode,
    msg: string,
    readonly details?: string,
  ) {
    super(msg);
  }

  get msg(): string {
    return this.message;
  }

  toJSON(): Omit<CniErrorResult, 'cniVersion'> {
    return this.details === undefined
      ? { code: this.code, msg: this.message }
      : { code: this.code, msg: this.message, details: this.details };
  }

  /** The error object as printed for a config of `cniVersion`. */
  toResult(cniVersion: string | undefined): CniErrorResult {
    return { cniVersion: errorVersion(cniVersion), ...this.toJSON() };
  }
}

/** The cniVersion an error carries: the config's ("same as provided") when it
 * looks like a version, else the latest this plugin speaks. Same rule as the C forwarder. */
export function errorVersion(requested: unknown): string {
  return typeof requested === 'string' && VERSION_PATTERN.test(requested) ? requested : LATEST_VERSION;
}
