// One CNI request, start to answer: validate (request.ts), call the handler,
// build the reply the forwarder prints. Handlers never build results: ADD
// answers the config's prevResult converted to its cniVersion.
import { CniError, errorVersion } from './errors.js';
import { parseRequest, type RawRequest } from './request.js';
import { convertResult } from './result.js';
import { CNI_ERROR_CODES } from './rules.js';
import type { CniHandlers } from './types.js';
import type { WireReply } from './wire.js';

export interface DispatchOutcome {
  reply: WireReply;
  verb: string;
  podNamespace?: string;
  podName?: string;
  containerId?: string;
  /** ADD only: what the handler decided (for the log line). */
  decision?: string;
  mode?: string;
  /** Set when the answer is a CNI error. */
  error?: CniError;
  /** Set when a handler threw something that is not a CniError (answered as 999). */
  unexpected?: unknown;
}

function requestedVersion(stdin: string): unknown {
  try {
    return (JSON.parse(stdin) as { cniVersion?: unknown } | null)?.cniVersion;
  } catch {
    return undefined;
  }
}

export async function dispatch(raw: RawRequest, handlers: CniHandlers): Promise<DispatchOutcome> {
  const outcome: DispatchOutcome = { verb: raw.command, reply: { exitCode: 0, stdout: '' } };
  let cniVersion: unknown;
  try {
    const parsed = parseRequest(raw);
    if (parsed.command === 'VERSION') {
      outcome.reply.stdout = JSON.stringify(parsed.versionInfo);
      return outcome;
    }
    const req = parsed.request;
    cniVersion = req.cniVersion;
    if (req.podNamespace) outcome.podNamespace = req.podNamespace;
    if (req.podName) outcome.podName = req.podName;
    if (req.containerId) outcome.containerId = req.containerId;
    switch (parsed.command) {
      case 'ADD': {
        // Convert first: a prevResult we cannot answer with must fail the ADD
        // before the handler sets anything up.
        const result = convertResult(req.config.prevResult, req.config.cniVersion);
        const added = await handlers.add(req);
        if (added) {
          outcome.decision = added.decision;
          if (added.mode) outcome.mode = added.mode;
        }
        outcome.reply.stdout = JSON.stringify(result);
        break;
      }
      case 'DEL':
        await handlers.del(req);
        break;
      case 'CHECK':
        await handlers.check(req);
        break;
      case 'STATUS':
        await handlers.status(req);
        break;
      case 'GC':
        await handlers.gc(req, parsed.validAttachments);
        break;
    }
    return outcome;
  } catch (err) {
    const version = cniVersion ?? requestedVersion(raw.stdin);
    const cniErr =
      err instanceof CniError
        ? err
        : new CniError(CNI_ERROR_CODES.INTERNAL, err instanceof Error ? err.message : String(err));
    if (!(err instanceof CniError)) outcome.unexpected = err;
    outcome.error = cniErr;
    outcome.reply = { exitCode: 1, stdout: JSON.stringify(cniErr.toResult(errorVersion(version))) };
    return outcome;
  }
}
