// The type check a Pod manifest from a file gets before the redirect code
// reads it: the API server would have refused a pod whose annotation value is
// a number (`port: 8080` unquoted in YAML) or whose `containers` is not a list
// of objects, so the code after it may assume the types of V1Pod. The
// message names the field as kubectl would (`spec.containers[0].name`).
import { isObject } from '../mesh/vocabulary.js';

type Check = (v: unknown, path: string) => string | undefined;

const str: Check = (v, p) => (typeof v === 'string' ? undefined
  : `${p} must be a string, got ${describe(v)}${typeof v === 'number' || typeof v === 'boolean' ? ' (quote it in YAML to make it a string)' : ''}`);
const bool: Check = (v, p) => (typeof v === 'boolean' ? undefined : `${p} must be true or false, got ${describe(v)}`);
const int: Check = (v, p) => (typeof v === 'number' && Number.isInteger(v) ? undefined : `${p} must be an integer, got ${describe(v)}`);

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'a list';
  if (typeof v === 'object') return 'a mapping';
  if (typeof v === 'string') return `the string ${JSON.stringify(v)}`;
  return `the ${typeof v} ${String(v)}`;
}

function fields(spec: Record<string, Check>): Check {
  return (v, p) => {
    if (!isObject(v)) return `${p} must be a mapping, got ${describe(v)}`;
    for (const [k, check] of Object.entries(spec)) {
      const x = v[k];
      if (x === undefined) continue;
      const problem = check(x, `${p}.${k}`);
      if (problem) return problem;
    }
    return undefined;
  };
}

function listOf(check: Check): Check {
  return (v, p) => {
    if (!Array.isArray(v)) return `${p} must be a list, got ${describe(v)}`;
    for (let i = 0; i < v.length; i++) {
      const problem = check(v[i], `${p}[${i}]`);
      if (problem) return problem;
    }
    return undefined;
  };
}

function mapOf(check: Check): Check {
  return (v, p) => {
    if (!isObject(v)) return `${p} must be a mapping, got ${describe(v)}`;
    for (const [k, x] of Object.entries(v)) {
      const problem = check(x, `${p}[${JSON.stringify(k)}]`);
      if (problem) return problem;
    }
    return undefined;
  };
}

const container = (v: unknown, p: string): string | undefined => {
  if (!isObject(v)) return `${p} must be a mapping (a container), got ${describe(v)}`;
  if (v.name === undefined) return `${p}.name is required`;
  return fields({
    name: str,
    args: listOf(str),
    env: listOf((e, q) => (isObject(e) && e.name === undefined ? `${q}.name is required` : fields({ name: str, value: str })(e, q))),
    securityContext: fields({ runAsUser: int, runAsGroup: int }),
  })(v, p);
};

const POD = fields({
  kind: str,
  metadata: fields({ name: str, namespace: str, annotations: mapOf(str), labels: mapOf(str) }),
  spec: fields({ hostNetwork: bool, containers: listOf(container), initContainers: listOf(container) }),
  status: fields({ podIP: str, podIPs: listOf(fields({ ip: str })) }),
});

/** The first field of `pod` whose type the API server would refuse, or undefined. */
export function podShapeProblem(pod: unknown): string | undefined {
  if (!isObject(pod)) return `the document must be a mapping (a Pod), got ${describe(pod)}`;
  return POD(pod, '')?.replace(/^\./, '');
}
