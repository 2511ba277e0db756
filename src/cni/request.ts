// One request from the forwarder, validated the way a runtime's plugin must
// validate it, into what the handlers get.
import { CniError } from './errors.js';
import { parseCniArgs, validateContainerId, validateIfname } from './env.js';
import { parseNetConf, validAttachments, type Attachment } from './netconf.js';
import { CNI_ERROR_CODES, CNI_VERBS, REQUIRED_ENV, type CniCommand, type RequiredEnvVar } from './rules.js';
import type { CniRequest } from './types.js';
import { versionInfo, type VersionInfo } from './versions.js';

/** What the forwarder sends: the runtime's environment and stdin, verbatim. */
export interface RawRequest {
  command: string;
  containerId: string;
  netns: string;
  ifname: string;
  args: string;
  path: string;
  stdin: string;
  /** ADD: the netns cookie the forwarder read in CNI_NETNS (decimal), when it could. */
  netnsCookie?: string;
}

export type ParsedRequest =
  | { command: 'VERSION'; versionInfo: VersionInfo }
  | { command: CniCommand; request: CniRequest; validAttachments: Attachment[] };

/** Where each required variable arrives in the wire request. */
const ENV_FIELD: Record<RequiredEnvVar, keyof RawRequest> = {
  CNI_CONTAINERID: 'containerId',
  CNI_NETNS: 'netns',
  CNI_IFNAME: 'ifname',
};

/**
 * Validates a request the way a runtime's plugin must: command, required env
 * (code 4), stdin JSON (6), cniVersion and verb support (1), config schema
 * (7), container id / ifname format (4), CNI_ARGS (4), GC attachments (7).
 * The netns path is passed through unchecked: whether it must exist is the
 * handler's decision (DEL works when it is gone).
 */
export function parseRequest(raw: RawRequest): ParsedRequest {
  if (raw.command === 'VERSION') {
    let requested: unknown;
    if (raw.stdin.trim() !== '') {
      try {
        requested = (JSON.parse(raw.stdin) as { cniVersion?: unknown } | null)?.cniVersion;
      } catch (err) {
        throw new CniError(CNI_ERROR_CODES.DECODE_FAILURE, `VERSION input is not valid JSON: ${(err as Error).message}`);
      }
    }
    return { command: 'VERSION', versionInfo: versionInfo(requested) };
  }
  if (raw.command === '') throw new CniError(CNI_ERROR_CODES.INVALID_ENV, 'CNI_COMMAND is not set');
  const command = raw.command as CniCommand;
  if (!CNI_VERBS.includes(command)) {
    throw new CniError(CNI_ERROR_CODES.INVALID_ENV, `CNI_COMMAND ${raw.command.slice(0, 64)} is unknown (want ADD, DEL, CHECK, STATUS, GC or VERSION)`);
  }
  const missing = REQUIRED_ENV[command].filter((v) => raw[ENV_FIELD[v]] === '');
  if (missing.length > 0) {
    throw new CniError(CNI_ERROR_CODES.INVALID_ENV, `${missing.join(', ')} ${missing.length > 1 ? 'are' : 'is'} not set (required for ${command})`);
  }
  if (raw.stdin.trim() === '') throw new CniError(CNI_ERROR_CODES.DECODE_FAILURE, 'network config on stdin is empty');
  const config = parseNetConf(raw.stdin, command);
  if (raw.containerId !== '') validateContainerId(raw.containerId);
  if (raw.ifname !== '') validateIfname(raw.ifname);
  const args = parseCniArgs(raw.args);
  const request: CniRequest = {
    command,
    containerId: raw.containerId,
    netns: raw.netns,
    ifname: raw.ifname,
    args,
    cniVersion: config.cniVersion,
    config,
  };
  if (args.K8S_POD_NAMESPACE) request.podNamespace = args.K8S_POD_NAMESPACE;
  if (args.K8S_POD_NAME) request.podName = args.K8S_POD_NAME;
  if (raw.netnsCookie !== undefined && command === 'ADD') request.netnsCookie = BigInt(raw.netnsCookie);
  return { command, request, validAttachments: command === 'GC' ? validAttachments(config) : [] };
}
