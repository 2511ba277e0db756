// mallocTrim(): glibc's malloc_trim(0), which hands the free pages inside the
// malloc heap back to the kernel (madvise), not only the heap's top. The
// agent calls it after its bursts (start-up, a self-check pass, a major GC):
// at 10,000 pods ~12 MiB of its brk heap was free but resident, chunks freed
// between ones still in use, which the automatic trim (top only) never
// returns (docs/bench-scale.md).
#include <malloc.h>

#include "common.h"

namespace meshcap {

namespace {

Napi::Value MallocTrim(const Napi::CallbackInfo& info) {
#ifdef __GLIBC__
  return Napi::Boolean::New(info.Env(), malloc_trim(0) != 0);
#else
  return Napi::Boolean::New(info.Env(), false);  // musl: nothing to trim this way
#endif
}

}  // namespace

void InitMemory(Napi::Env env, Napi::Object exports) {
  exports.Set("mallocTrim", Napi::Function::New(env, MallocTrim, "mallocTrim"));
}

}  // namespace meshcap
