// The Helm chart (deploy/helm/meshcap) rendered by a real helm built from its
// Go module (scripts/build-helm.sh), for several values sets: the least-
// privilege rules every render must keep, the values that must show up in the
// containers' args and RBAC, and the plain manifests (deploy/meshcap.yaml, the
// kustomize base) equal to the default render. The same renders go through a
// real kube-apiserver's server-side dry-run in test/k8s/deploy-manifests.test.ts.
// In the k8s project, not the unit one: like the control plane, helm and
// kustomize are Go builds that setup makes (scripts/build-helm.sh).
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { describe, expect, it } from 'vitest';
import { projectRoot } from '../../src/paths.js';
// @ts-expect-error a plain .mjs script without types
import { renderPlain, TARGETS } from '../../scripts/render-manifests.mjs';
import { KUSTOMIZE, render, requireChartTools, VALUE_SETS, type Obj } from '../helpers/chart.js';

requireChartTools();

const byKind = (objs: Obj[], kind: string) => objs.filter((o) => o.kind === kind);
const ds = (objs: Obj[]) => byKind(objs, 'DaemonSet')[0]!;
const container = (objs: Obj[], name: string) => ds(objs).spec.template.spec.containers.find((c: { name: string }) => c.name === name);
const arg = (c: { args: string[] }, flag: string) => c.args.find((a) => a.startsWith(`${flag}=`))?.slice(flag.length + 1);

describe.each(Object.entries(VALUE_SETS))('helm template (%s)', (_name, args) => {
  const objs = render(args);

  it('renders exactly the expected objects', () => {
    expect(objs.map((o) => `${o.kind}/${o.metadata.name}`).sort()).toEqual([
      'ClusterRole/meshcap', 'ClusterRoleBinding/meshcap', 'DaemonSet/meshcap', 'Role/meshcap', 'RoleBinding/meshcap', 'ServiceAccount/meshcap',
    ]);
  });

  it('is least-privilege: no privileged container, named capabilities only, nothing else escalates', () => {
    const spec = ds(objs).spec.template.spec;
    for (const c of [...spec.containers, ...(spec.initContainers ?? [])]) {
      expect(c.securityContext.privileged ?? false, c.name).toBe(false);
      expect(c.securityContext.allowPrivilegeEscalation, c.name).toBe(false);
      expect(c.securityContext.capabilities.drop, c.name).toEqual(['ALL']);
    }
    // the set test/privileged/agent/capabilities.test.ts measures
    expect(container(objs, 'agent').securityContext.capabilities.add).toEqual(['NET_ADMIN', 'SYS_ADMIN', 'SYS_PTRACE', 'DAC_OVERRIDE']);
    expect(container(objs, 'install-cni').securityContext.capabilities.add).toBeUndefined();
    expect(container(objs, 'install-cni').securityContext.readOnlyRootFilesystem).toBe(true);
    // Bidirectional propagation needs a privileged container; none is asked for
    expect(JSON.stringify(spec)).not.toContain('Bidirectional');
  });

  it('mounts only the host paths each container needs', () => {
    const spec = ds(objs).spec.template.spec;
    const hostPaths = Object.fromEntries(spec.volumes.map((v: { name: string; hostPath: { path: string } }) => [v.name, v.hostPath.path]));
    const mounts = (name: string) => container(objs, name).volumeMounts.map((m: { name: string }) => hostPaths[m.name]).sort();
    expect(mounts('agent')).toEqual(['/sys/fs/bpf', '/sys/fs/cgroup', '/var/run/meshcap', '/var/run/netns']);
    const cni = arg(container(objs, 'install-cni'), '--cni-conf-dir')!.replace(/^\/host/, '');
    const bin = arg(container(objs, 'install-cni'), '--cni-bin-dir')!.replace(/^\/host/, '');
    expect(mounts('install-cni')).toEqual([cni, bin].sort());
  });

  it('keeps off Envoy\'s 15090 and probes both containers on their own ports', () => {
    const a = container(objs, 'agent');
    const i = container(objs, 'install-cni');
    const pa = Number(arg(a, '--metrics-addr')!.split(':').pop());
    const pi = Number(arg(i, '--metrics-addr')!.split(':').pop());
    expect(new Set([pa, pi]).size).toBe(2);
    for (const p of [pa, pi]) expect(p === 15090 || (p >= 15000 && p <= 15099) || (p >= 4140 && p <= 4199)).toBe(false);
    expect(a.readinessProbe.httpGet).toEqual({ path: '/readyz', port: pa });
    expect(i.readinessProbe.httpGet).toEqual({ path: '/readyz', port: pi });
  });

  it('sets resources, nodeSelector, priorityClass, grace period, tolerations', () => {
    const spec = ds(objs).spec.template.spec;
    expect(spec.nodeSelector).toEqual({ 'kubernetes.io/os': 'linux' });
    expect(spec.priorityClassName).toBe('system-node-critical');
    expect(spec.terminationGracePeriodSeconds).toBeGreaterThanOrEqual(10);
    for (const c of spec.containers) {
      expect(c.resources.requests.cpu, c.name).toBeDefined();
      expect(c.resources.limits.memory, c.name).toBeDefined();
    }
  });

  it('gives RBAC only what the agent and install-cni use', () => {
    const repair = args.includes('repair=label') ? 'label' : args.includes('repair=delete') ? 'delete' : 'other';
    const rules = byKind(objs, 'ClusterRole')[0]!.rules as { resources: string[]; verbs: string[] }[];
    const verbs = (res: string) => rules.filter((r) => r.resources.includes(res)).flatMap((r) => r.verbs).sort();
    expect(verbs('pods')).toEqual(['get', 'list', 'watch', ...(repair === 'label' ? ['patch'] : repair === 'delete' ? ['delete'] : [])].sort());
    expect(verbs('events')).toEqual(['create']);
    const taint = args.includes('nodeTaint=meshcap.io/not-ready');
    expect(new Set(rules.flatMap((r) => r.resources))).toEqual(new Set(['pods', 'events', ...(taint ? ['nodes'] : [])]));
    expect(verbs('nodes')).toEqual(taint ? ['get', 'patch'] : []);
    expect(rules.every((r) => !r.verbs.includes('*') && !r.resources.includes('*'))).toBe(true);
    const role = byKind(objs, 'Role')[0]!.rules;
    expect(role).toEqual([{ apiGroups: ['apps'], resources: ['daemonsets'], resourceNames: ['meshcap'], verbs: ['get', 'watch'] }]);
    expect(arg(container(objs, 'install-cni'), '--daemonset')).toBe('meshcap-system/meshcap');
  });

  it('passes the values to the agent and install-cni (args relative to the image\'s entrypoint)', () => {
    const a = container(objs, 'agent');
    const i = container(objs, 'install-cni');
    expect(a.args[0]).toBe('agent');
    expect(i.args[0]).toBe('install-cni');
    expect(a.command).toBeUndefined();
    const linkerd = args.includes('profile=linkerd');
    const excl = arg(a, '--exclude-namespaces')!.split(',');
    expect(excl).toEqual(linkerd ? ['kube-system', 'linkerd', 'linkerd-cni', 'meshcap-system', 'monitoring', 'ci'] : ['kube-system', 'istio-system', 'meshcap-system']);
    expect(arg(i, '--exclude-namespaces')).toBe(arg(a, '--exclude-namespaces'));
    expect(arg(i, '--agent-socket')).toBe(arg(a, '--socket'));
    const set = (k: string) => { const at = args.indexOf(`${k}=`); const s = args.find((x) => x.startsWith(`${k}=`)); return at >= 0 || s ? s!.slice(k.length + 1) : undefined; };
    expect(arg(a, '--mode')).toBe(set('mode') ?? 'auto');
    expect(arg(a, '--repair')).toBe(set('repair') ?? 'repair');
    expect(a.args.includes('--splice')).toBe(false); // removed in issue 20
    expect(arg(i, '--conf-file')).toBe(set('cni.confFile'));
    expect(arg(i, '--remove-node-taint')).toBe(set('nodeTaint'));
    if (set('nodeTaint')) expect(arg(i, '--agent-readyz')).toBe(`http://127.0.0.1:${arg(a, '--metrics-addr')!.split(':').pop()}/readyz`);
    expect(a.image).toBe(`${set('image.repository') ?? 'localhost/meshcap'}:${set('image.tag') ?? 'dev'}`);
  });
});

describe('the plain manifests', () => {
  it('deploy/meshcap.yaml and the kustomize base are the chart\'s default render (node scripts/render-manifests.mjs)', () => {
    const fresh = renderPlain();
    for (const t of TARGETS as string[]) expect(readFileSync(path.join(projectRoot, t), 'utf8'), `${t} is stale: run node scripts/render-manifests.mjs`).toBe(fresh);
  });
  it('kustomize build of the base gives the same objects', () => {
    const built = execFileSync(KUSTOMIZE, ['build', path.join(projectRoot, 'deploy/kustomize/base')], { encoding: 'utf8' });
    const objs = parseAllDocuments(built).map((d) => d.toJS() as Obj);
    const plain = parseAllDocuments(readFileSync(path.join(projectRoot, 'deploy/meshcap.yaml'), 'utf8')).map((d) => d.toJS() as Obj).filter(Boolean);
    const key = (o: Obj) => `${o.kind}/${o.metadata.namespace ?? ''}/${o.metadata.name}`;
    expect(objs.map(key).sort()).toEqual(plain.map(key).sort());
    for (const o of objs) expect(o).toEqual(plain.find((p) => key(p) === key(o)));
  });
  it('refuses an unknown profile', () => {
    expect(() => render(['--set', 'profile=consul'])).toThrow(/profile must be istio or linkerd/);
  });
});
