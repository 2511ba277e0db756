// consts: enum name -> number tables. Names come from the system
// <linux/bpf.h> (bpf_enums.inc is generated from it at build time, helper
// names from its __BPF_FUNC_MAPPER); the numbers from the compiler.
#include <linux/bpf.h>

#include "common.h"

namespace meshcap {

namespace {

struct Entry {
  const char* table;
  const char* name;
  long long value;
};

const Entry kEnums[] = {
#define MESHCAP_ENUM(table, name, value) {#table, name, static_cast<long long>(value)},
#include "bpf_enums.inc"
#undef MESHCAP_ENUM
};

struct Helper {
  const char* name;
  long long id;
};

const Helper kHelpers[] = {
#define MESHCAP_HELPER(name, ...) {#name, static_cast<long long>(BPF_FUNC_##name)}
    __BPF_FUNC_MAPPER(MESHCAP_HELPER)
#undef MESHCAP_HELPER
};

}  // namespace

void InitConsts(Napi::Env env, Napi::Object exports) {
  Napi::Object consts = Napi::Object::New(env);
  for (const char* t : {"progType", "attachType", "mapType", "linkType"})
    consts.Set(t, Napi::Object::New(env));
  for (const Entry& e : kEnums)
    consts.Get(e.table).As<Napi::Object>().Set(e.name, Napi::Number::New(env, static_cast<double>(e.value)));
  Napi::Object helpers = Napi::Object::New(env);
  for (const Helper& h : kHelpers) helpers.Set(h.name, Napi::Number::New(env, static_cast<double>(h.id)));
  consts.Set("helper", helpers);
  consts.Set("BPF_ANY", Napi::Number::New(env, BPF_ANY));
  consts.Set("BPF_NOEXIST", Napi::Number::New(env, BPF_NOEXIST));
  consts.Set("BPF_EXIST", Napi::Number::New(env, BPF_EXIST));
  consts.Set("BPF_F_REPLACE", Napi::Number::New(env, BPF_F_REPLACE));
  consts.Set("BPF_F_LOCK", Napi::Number::New(env, BPF_F_LOCK));
  exports.Set("consts", consts);
}

}  // namespace meshcap
