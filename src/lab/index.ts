// The lab: throwaway network namespaces, veth pairs with addresses from
// 198.18.0.0/15 and 2001:db8::/32 only, processes inside them, and the
// registry that removes all of it. Used by the sandbox, the kernel probe,
// the test helpers and the benches (docs/architecture.md, "The lab").
export { assertLabAddress, LAB_RANGES } from './addresses.js';
export { atExit, Cleanup, cleanupOnSignals, SIGNAL_EXIT, type CleanupStep } from './cleanup.js';
export { Lab, type LabNetns, type LinkAddrs } from './lab.js';
export { addNetns, addNetnsSync, delNetns, delNetnsSync, listNetns, listNetnsSync, netnsPath, netnsPids, NETNS_DIR, type AddNetnsOpts } from './netns.js';
export { inNetns, startProc, tail, type InNetnsOpts, type Proc } from './process.js';
export { addVeth, addVethSync, vethCommands, type VethEnd } from './veth.js';
