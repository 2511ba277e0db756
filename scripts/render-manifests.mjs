#!/usr/bin/env node
// Renders the Helm chart's defaults into the plain manifests:
//   deploy/meshcap.yaml                 (kubectl apply -f)
//   deploy/kustomize/base/meshcap.yaml  (the kustomize base's one resource)
// test/k8s/deploy-chart.test.ts fails when either differs from a fresh
// render, so the chart stays the one source. `--check` only compares.
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const HELM = path.join(repo, 'build/helm/bin/helm');
export const TARGETS = ['deploy/meshcap.yaml', 'deploy/kustomize/base/meshcap.yaml'];

export function renderPlain() {
  const out = execFileSync(HELM, ['template', 'meshcap', path.join(repo, 'deploy/helm/meshcap'), '--namespace', 'meshcap-system', '--set', 'createNamespace=true'], { encoding: 'utf8' });
  return [
    '# GENERATED from deploy/helm/meshcap with its default values by scripts/render-manifests.mjs; do not edit.',
    '# Install: kubectl apply -f deploy/meshcap.yaml (docs/install.md). Image: localhost/meshcap:dev (deploy/Containerfile).',
    out.replace(/^---\n/, ''),
  ].join('\n');
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const text = renderPlain();
  const check = process.argv.includes('--check');
  let stale = 0;
  for (const t of TARGETS) {
    const file = path.join(repo, t);
    if (check) {
      let now = '';
      try {
        now = readFileSync(file, 'utf8');
      } catch { /* missing */ }
      if (now !== text) {
        console.error(`${t} differs from the chart's render: run node scripts/render-manifests.mjs`);
        stale++;
      }
    } else {
      writeFileSync(file, text);
      console.log(`wrote ${t}`);
    }
  }
  process.exitCode = stale ? 1 : 0;
}
