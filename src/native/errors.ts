// NativeError: every failed syscall or libbpf call in the native addon
// surfaces as one of these, carrying the errno name, the call and the
// program/map/path concerned, plus a hint where the fix is obvious.

/** What the addon reports; NativeError turns it into a readable error. */
export interface NativeErrorInit {
  code: string;
  errno: number;
  syscall: string;
  /** strerror text of errno (libbpf_strerror, so libbpf's own codes read well too). */
  detail?: string;
  object?: string;
  log?: string;
}

export class NativeError extends Error {
  /** errno name, e.g. 'EPERM' ('ENOTSUPP' and 'LIBBPF_ERRNO__*' for kernel/libbpf-only codes). */
  readonly code: string;
  readonly errno: number;
  /** the libbpf function or syscall that failed, e.g. 'bpf_link_create'. */
  readonly syscall: string;
  /** the program/map/path concerned. */
  readonly object?: string;
  /** captured libbpf output (with the verifier log) when a load failed. */
  readonly log?: string;

  constructor(init: NativeErrorInit) {
    const subject = init.log ? loadFailureSubject(init.log) : undefined;
    const object = subject && init.object ? `${subject.kind} '${subject.name}' of ${init.object}` : init.object;
    const detail = init.detail ?? `errno ${init.errno}`;
    let message = `${init.syscall}${object ? ` ${object}` : ''}: ${detail} (${init.code})`;
    if (subject?.reason) message += `: ${subject.reason}`;
    const hint = hintFor(init.code, init.syscall, init.log);
    if (hint) message += ` - ${hint}`;
    super(message);
    this.name = 'NativeError';
    this.code = init.code;
    this.errno = init.errno;
    this.syscall = init.syscall;
    if (object !== undefined) this.object = object;
    if (init.log !== undefined) this.log = init.log;
  }
}

export function isNativeError(e: unknown, code?: string): e is NativeError {
  return e instanceof NativeError && (code === undefined || e.code === code);
}

/** A hint for the operator where the errno has one usual cause. */
export function hintFor(code: string, syscall: string, log?: string): string | undefined {
  if (code === 'EPERM' && syscall.startsWith('RTM_')) return "changing a netns's routes or rules needs CAP_NET_ADMIN (the agent's DaemonSet grants it)";
  if (code === 'EINVAL' && syscall === 'RTM_NEWRULE') return 'a rule that matches ipproto needs Linux >= 4.17';
  if (code === 'EPERM') {
    return 'needs root or CAP_BPF (+ CAP_NET_ADMIN for network program types, CAP_SYS_ADMIN for cgroup/netns attach)';
  }
  if (code === 'ENOENT' && (syscall === 'bpf_obj_pin' || syscall === 'bpf_obj_get' || syscall === 'bpf_map__set_pin_path')) {
    return 'no such pin, or bpffs not mounted there? (mount -t bpf bpf /sys/fs/bpf)';
  }
  if (syscall === 'bpf_object__load') {
    if (log && /couldn't reuse pinned map|can't reuse pinned map|error reusing pinned map/.test(log)) {
      return 'a map pinned under the pin directory has a different type/key/value/max_entries/flags; remove the pin (or migrate it) and load again';
    }
    if (code === 'EACCES' || code === 'EINVAL') return 'the verifier rejected a program; see .log';
  }
  if (code === 'ENOPROTOOPT' && syscall.includes('SO_NETNS_COOKIE')) {
    return 'SO_NETNS_COOKIE needs Linux >= 5.14';
  }
  if ((code === 'ENOENT' || code === 'ENOPROTOOPT') && syscall.includes('ORIGINAL_DST')) {
    return 'the socket has no recorded original destination (not a redirected connection)';
  }
  if (code === 'ENOENT' && syscall === 'open') return 'path does not exist (netns or cgroup already gone?)';
  return undefined;
}

export interface LoadFailureSubject {
  kind: 'prog' | 'map';
  name: string;
  /** The verifier's (or libbpf's) one-line reason, when the log has one. */
  reason?: string;
}

/**
 * Which program or map made bpf_object__load fail, from libbpf's log lines
 * ("libbpf: prog 'x': failed to load: -13", "libbpf: map 'm': error reusing
 * pinned map").
 */
export function loadFailureSubject(log: string): LoadFailureSubject | undefined {
  const lines = log.split('\n');
  for (const line of lines) {
    const prog = /prog '([^']+)': (?:failed to load|BPF program load failed)/.exec(line);
    if (prog?.[1]) {
      const reason = verifierReason(log);
      return reason ? { kind: 'prog', name: prog[1], reason } : { kind: 'prog', name: prog[1] };
    }
    const map = /map '([^']+)': (?:error reusing pinned map|failed to create|can't reuse|failed to pin)/.exec(line);
    if (map?.[1]) return { kind: 'map', name: map[1] };
  }
  return undefined;
}

/** The last meaningful verifier line (the rejection reason) of a prog load log. */
export function verifierReason(log: string): string | undefined {
  const begin = log.indexOf('-- BEGIN PROG LOAD LOG --');
  const end = log.indexOf('-- END PROG LOAD LOG --');
  if (begin < 0 || end < begin) return undefined;
  const body = log
    .slice(begin, end)
    .split('\n')
    .slice(1)
    .map((l) => l.trim())
    .filter((l) => l && !/^processed \d+ insns|^verification time/.test(l));
  return body.at(-1);
}
