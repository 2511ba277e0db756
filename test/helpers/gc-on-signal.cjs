// Preloaded into the agent process by the fault tests (node --expose-gc
// --require): SIGUSR2 runs a full garbage collection, so RSS is compared
// with the heap at rest rather than wherever V8's GC timing left it.
process.on('SIGUSR2', () => {
  global.gc();
  global.gc();
});
