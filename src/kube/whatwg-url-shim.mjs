// What the client-node bundle gets for `import whatwgUrl from 'whatwg-url'`
// (scripts/build.mjs aliases it). node-fetch 2 imports whatwg-url only to
// use its URL when node:url has none (`Url.URL || whatwgUrl.URL`), which no
// Node it runs on lacks; the real module would bring tr46's Unicode mapping
// table (70% of the bundle's lines) and its ICU-backed regular expressions
// into the agent's memory for nothing.
export const URL = globalThis.URL;
export default { URL };
