// client-node's KubeConfig and Watch, and the node-fetch they use, loaded from
// build/kube/client-node.mjs: a tree-shaken bundle of just those, made by
// scripts/build.mjs from src/kube/client-node-entry.mjs, which says why (the
// package itself loads its whole generated API, ~28 MB of heap). The types are
// the package's own.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import type { KubeConfig as KubeConfigClass, Watch as WatchClass } from '@kubernetes/client-node';
import type nodeFetch from 'node-fetch';
import { projectRoot } from '../paths.js';

export const CLIENT_NODE_BUNDLE = path.join(projectRoot, 'build', 'kube', 'client-node.mjs');

interface ClientNodeBundle {
  KubeConfig: typeof KubeConfigClass;
  Watch: typeof WatchClass;
  fetch: typeof nodeFetch;
}

if (!existsSync(CLIENT_NODE_BUNDLE)) {
  throw new Error(`${CLIENT_NODE_BUNDLE} is missing: run 'npm run setup' (scripts/build.mjs bundles @kubernetes/client-node's KubeConfig and Watch there)`);
}
const bundle = (await import(pathToFileURL(CLIENT_NODE_BUNDLE).href)) as ClientNodeBundle;

export const KubeConfig = bundle.KubeConfig;
export type KubeConfig = KubeConfigClass;
export const Watch = bundle.Watch;
export const fetch = bundle.fetch;
