// The Helm chart's renders (several values sets), the plain manifest and the
// uninstall Job, validated by a real kube-apiserver: created with
// dryRun=All&fieldValidation=Strict, so every field must exist in the
// server's schema (an unknown or misspelt field fails), admission runs (the
// priority class must exist), and nothing is stored.
import { readFileSync } from 'node:fs';
import { request } from 'node:https';
import path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { projectRoot } from '../../src/paths.js';
import { ControlPlane, controlPlaneBuilt } from '../helpers/k8s-control-plane.js';
import { render, requireChartTools, VALUE_SETS } from '../helpers/chart.js';

requireChartTools();
if (!controlPlaneBuilt()) throw new Error('build/k8s/bin is missing kube-apiserver/etcd/etcdctl: run `npm run setup` (scripts/build-k8s.sh builds them)');

type Obj = { apiVersion: string; kind: string; metadata: { name: string; namespace?: string } };
const PLURAL: Record<string, string> = {
  Namespace: 'namespaces', ServiceAccount: 'serviceaccounts', ClusterRole: 'clusterroles', ClusterRoleBinding: 'clusterrolebindings',
  Role: 'roles', RoleBinding: 'rolebindings', DaemonSet: 'daemonsets', Job: 'jobs',
};

let cp: ControlPlane;

/** POST the object with a server-side dry-run and strict field validation; the server's answer. */
function dryRunCreate(o: Obj, dryRun = true): Promise<{ code: number; body: string; warnings: string[] }> {
  const [group, version] = o.apiVersion.includes('/') ? o.apiVersion.split('/') : ['', o.apiVersion];
  const base = group ? `/apis/${group}/${version}` : `/api/${version}`;
  const ns = o.metadata.namespace ? `/namespaces/${o.metadata.namespace}` : '';
  const url = `${base}${ns}/${PLURAL[o.kind]}?fieldValidation=Strict${dryRun ? '&dryRun=All' : ''}`;
  const body = JSON.stringify(o);
  return new Promise((resolve, reject) => {
    const req = request({
      host: '127.0.0.1', port: cp.apiserverPort, path: url, method: 'POST',
      ca: readFileSync(cp.caFile), cert: readFileSync(path.join(cp.pki, 'admin.crt')), key: readFileSync(path.join(cp.pki, 'admin.key')),
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
    }, (res) => {
      let text = '';
      res.on('data', (d: Buffer) => (text += d.toString()));
      res.on('end', () => {
        const w = res.headers.warning;
        resolve({ code: res.statusCode ?? 0, body: text, warnings: w ? (Array.isArray(w) ? w : [w]) : [] });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

async function expectAccepted(objs: Obj[]): Promise<void> {
  for (const o of objs) {
    const r = await dryRunCreate(o);
    expect(r.code, `${o.kind}/${o.metadata.name}: ${r.body}`).toBe(201);
    expect(r.warnings, `${o.kind}/${o.metadata.name}`).toEqual([]);
  }
}

beforeAll(async () => {
  cp = await ControlPlane.start();
  // namespaced dry-runs need their namespace to exist
  for (const name of ['meshcap-system', 'other-ns']) {
    const r = await dryRunCreate({ apiVersion: 'v1', kind: 'Namespace', metadata: { name } }, false);
    expect(r.code, r.body).toBe(201);
  }
});
afterAll(async () => {
  await cp?.stop();
});

describe('manifests against a real kube-apiserver (server-side dry-run, strict fields)', () => {
  it.each(Object.entries(VALUE_SETS))('the chart with values %s', async (_n, args) => {
    await expectAccepted(render(args) as Obj[]);
  });
  it('the chart in another namespace', async () => {
    await expectAccepted(render([], 'other-ns') as Obj[]);
  });
  it('deploy/meshcap.yaml (its Namespace exists already: everything else)', async () => {
    const objs = parseAllDocuments(readFileSync(path.join(projectRoot, 'deploy/meshcap.yaml'), 'utf8')).map((d) => d.toJS() as Obj).filter(Boolean);
    expect(objs[0]!.kind).toBe('Namespace');
    await expectAccepted(objs.slice(1));
  });
  it('deploy/uninstall-job.yaml with a node name filled in', async () => {
    const text = readFileSync(path.join(projectRoot, 'deploy/uninstall-job.yaml'), 'utf8').replace(/NODE_NAME/g, 'node-1');
    await expectAccepted(parseAllDocuments(text).map((d) => d.toJS() as Obj));
  });
  it('a misspelt field is refused (the check can fail)', async () => {
    const ds = (render([]) as (Obj & { spec: { template: { spec: Record<string, unknown> } } })[]).find((o) => o.kind === 'DaemonSet')!;
    ds.spec.template.spec.hostNetwrok = true;
    const r = await dryRunCreate(ds);
    expect(r.code).toBe(400);
    expect(r.body).toMatch(/unknown field .*hostNetwrok/);
  });
});
