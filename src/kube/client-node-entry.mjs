// The parts of @kubernetes/client-node the node's long-running processes use,
// bundled by scripts/build.mjs into build/kube/client-node.mjs (rolldown,
// tree-shaken; src/kube/client-node.ts loads it).
//
// Why a bundle: the package's entry, and its KubeConfig's own module, import
// the whole generated API (about 1,000 modules: every API group and model
// class). Loading it cost the agent ~28 MB of V8 heap and ~46 MB of RSS that
// it never used (docs/bench-scale.md, "The agent in a cluster"). KubeConfig
// (credentials, TLS, proxies) and Watch are taken as they are; the few REST
// calls the agent makes go through node-fetch, as Watch's do, in
// src/kube/rest.ts.
export { KubeConfig } from '@kubernetes/client-node/dist/config.js';
export { Watch } from '@kubernetes/client-node/dist/watch.js';
export { default as fetch } from 'node-fetch';
