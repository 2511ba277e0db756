// The forwarder <-> agent wire protocol (docs/cni.md): one JSON request per
// connection, ended by the client's half-close; one JSON reply, ended by the
// server's close. Pure codec, no I/O.
import { CniError } from './errors.js';
import type { RawRequest } from './request.js';
import { CNI_ERROR_CODES } from './rules.js';

export const WIRE_VERSION = 1;

/** Cap on a request: stdin (<= 1 MiB in the forwarder) JSON-escaped, plus env. */
export const MAX_REQUEST_BYTES = 4 << 20;

export interface WireReply {
  /** The plugin's exit code: 0 success, 1 CNI error. */
  exitCode: number;
  /** Exactly what the forwarder prints on stdout. */
  stdout: string;
  /**
   * Who answered: the agent's version, on every reply (an optional field the
   * forwarder ignores, so protocol v1 is unchanged): `meshcap version` asks
   * the agent with a VERSION request and reads it here.
   */
  agent?: { version: string; commit: string | null; dirty?: boolean };
}

const STRING_FIELDS = ['command', 'containerId', 'netns', 'ifname', 'args', 'path', 'stdin'] as const;

/** Decodes one request. Throws CniError(6) for anything that is not a v1 request. */
export function decodeWireRequest(input: string | Buffer): RawRequest {
  let msg: unknown;
  try {
    msg = JSON.parse(typeof input === 'string' ? input : input.toString('utf8'));
  } catch (err) {
    throw new CniError(CNI_ERROR_CODES.DECODE_FAILURE, `forwarder request is not valid JSON: ${(err as Error).message}`);
  }
  if (typeof msg !== 'object' || msg === null || Array.isArray(msg)) {
    throw new CniError(CNI_ERROR_CODES.DECODE_FAILURE, 'forwarder request must be a JSON object');
  }
  const m = msg as Record<string, unknown>;
  if (m.v !== WIRE_VERSION) {
    throw new CniError(
      CNI_ERROR_CODES.DECODE_FAILURE,
      `forwarder speaks wire protocol ${JSON.stringify(m.v)}, this agent speaks ${WIRE_VERSION}; install the meshcap-cni binary that ships with this agent`,
    );
  }
  const out = {} as RawRequest;
  for (const k of STRING_FIELDS) {
    const v = m[k] ?? '';
    if (typeof v !== 'string') throw new CniError(CNI_ERROR_CODES.DECODE_FAILURE, `forwarder request field ${k} must be a string`);
    out[k] = v;
  }
  // Optional (ADD, forwarders since it was added): the pod netns's cookie as
  // the forwarder read it, a u64 in decimal; absent, the agent looks it up.
  if (m.netnsCookie !== undefined) {
    const c = m.netnsCookie;
    if (typeof c !== 'string' || !/^[1-9][0-9]{0,19}$/.test(c) || BigInt(c) >= 1n << 64n) {
      throw new CniError(CNI_ERROR_CODES.DECODE_FAILURE, `forwarder request field netnsCookie must be a non-zero u64 in decimal, got ${JSON.stringify(c).slice(0, 40)}`);
    }
    out.netnsCookie = c;
  }
  return out;
}

export function encodeWireReply(reply: WireReply): string {
  return JSON.stringify(reply);
}
