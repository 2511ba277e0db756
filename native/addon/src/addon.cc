// Entry point of meshcap_native.node.
#include "common.h"

namespace meshcap {

AddonData& Data(Napi::Env env) { return *env.GetInstanceData<AddonData>(); }

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  env.SetInstanceData<AddonData>(new AddonData());
  InitErrors(env, exports);
  InitLibbpfLog(env, exports);
  InitBpfObject(env, exports);
  InitLinks(env, exports);
  InitMaps(env, exports);
  InitInfo(env, exports);
  InitProbes(env, exports);
  InitNetnsCookie(env, exports);
  InitNetnsRoutes(env, exports);
  InitOrigDst(env, exports);
  InitPidfd(env, exports);
  InitConsts(env, exports);
  InitProgTemplate(env, exports);
  InitMemory(env, exports);
  InitCniListener(env, exports);
  return exports;
}

}  // namespace meshcap

static Napi::Object InitMeshcap(Napi::Env env, Napi::Object exports) {
  return meshcap::Init(env, exports);
}
NODE_API_MODULE(meshcap_native, InitMeshcap)
