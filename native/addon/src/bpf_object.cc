// BpfObject: one libbpf bpf_object (open -> setRodata -> load -> close).
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <linux/btf.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common.h"
#include "libbpf_log.h"

namespace meshcap {

namespace {

enum class State { Opened, Loading, Loaded, LoadFailed, Closed };

const char* StateName(State s) {
  switch (s) {
    case State::Opened: return "opened";
    case State::Loading: return "loading";
    case State::Loaded: return "loaded";
    case State::LoadFailed: return "load-failed";
    case State::Closed: return "closed";
  }
  return "?";
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class BpfObjectWrap : public Napi::ObjectWrap<BpfObjectWrap> {
 public:
  static Napi::Function Class(Napi::Env env) {
    return DefineClass(env, "BpfObject",
                       {InstanceAccessor<&BpfObjectWrap::Path>("path"),
                        InstanceMethod<&BpfObjectWrap::SetRodata>("setRodata"),
                        InstanceMethod<&BpfObjectWrap::SetMaxEntries>("setMaxEntries"),
                        InstanceMethod<&BpfObjectWrap::Load>("load"),
                        InstanceMethod<&BpfObjectWrap::Programs>("programs"),
                        InstanceMethod<&BpfObjectWrap::Maps>("maps"),
                        InstanceMethod<&BpfObjectWrap::Close>("close")});
  }

  // new BpfObject(path, mapPinDir | undefined); JS code calls openObject().
  explicit BpfObjectWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<BpfObjectWrap>(info) {
    Napi::Env env = info.Env();
    path_ = ArgString(info, 0, "openObject", "path");
    std::string pinDir;
    if (ArgPresent(info, 1)) pinDir = ArgString(info, 1, "openObject", "opts.mapPinDir");
    while (pinDir.size() > 1 && pinDir.back() == '/') pinDir.pop_back();

    LibbpfLogCapture cap;
    errno = 0;
    obj_ = bpf_object__open_file(path_.c_str(), nullptr);
    if (!obj_) {
      int err = errno ? errno : EINVAL;
      ThrowNativeError(env, err, "bpf_object__open_file", path_, &cap.text());
    }
    if (!pinDir.empty()) {
      bpf_map* map;
      bpf_object__for_each_map(map, obj_) {
        // Internal maps (.rodata/.data/.bss/.kconfig) hold per-load config:
        // reusing a pinned, frozen .rodata would silently keep old values.
        if (bpf_map__is_internal(map)) continue;
        std::string pin = pinDir + "/" + bpf_map__name(map);
        int r = bpf_map__set_pin_path(map, pin.c_str());
        if (r < 0) {
          int err = ErrOf(r);
          bpf_object__close(obj_);
          obj_ = nullptr;
          ThrowNativeError(env, err, "bpf_map__set_pin_path", pin, &cap.text());
        }
      }
    }
    state_ = State::Opened;
  }

  ~BpfObjectWrap() override {
    // Garbage-collected without close(): release the object (pins stay). Never
    // while a load runs: the worker holds a reference, so we cannot get here.
    if (obj_) bpf_object__close(obj_);
  }

  bpf_object* obj() { return obj_; }
  const std::string& path() const { return path_; }
  void FinishLoad(bool ok) { state_ = ok ? State::Loaded : State::LoadFailed; }

 private:
  void Require(Napi::Env env, const char* op, std::initializer_list<State> ok) {
    for (State s : ok)
      if (state_ == s) return;
    throw Napi::Error::New(env, std::string("BpfObject ") + path_ + ": " + op +
                                    " is not allowed when the object is " + StateName(state_));
  }

  Napi::Value Path(const Napi::CallbackInfo& info) { return Napi::String::New(info.Env(), path_); }

  void SetRodata(const Napi::CallbackInfo& info);
  void SetMaxEntries(const Napi::CallbackInfo& info);
  Napi::Value Load(const Napi::CallbackInfo& info);

  Napi::Value Programs(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Require(env, "programs()", {State::Opened, State::Loading, State::Loaded, State::LoadFailed});
    Napi::Array out = Napi::Array::New(env);
    uint32_t i = 0;
    bpf_program* prog;
    bpf_object__for_each_program(prog, obj_) {
      Napi::Object p = Napi::Object::New(env);
      p.Set("name", bpf_program__name(prog));
      p.Set("section", bpf_program__section_name(prog));
      p.Set("type", Napi::Number::New(env, bpf_program__type(prog)));
      p.Set("expectedAttachType", Napi::Number::New(env, bpf_program__expected_attach_type(prog)));
      int fd = state_ == State::Loaded ? bpf_program__fd(prog) : -1;
      p.Set("fd", Napi::Number::New(env, fd < 0 ? -1 : fd));
      out.Set(i++, p);
    }
    return out;
  }

  Napi::Value Maps(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Require(env, "maps()", {State::Opened, State::Loading, State::Loaded, State::LoadFailed});
    Napi::Array out = Napi::Array::New(env);
    uint32_t i = 0;
    bpf_map* map;
    bpf_object__for_each_map(map, obj_) {
      Napi::Object m = Napi::Object::New(env);
      m.Set("name", bpf_map__name(map));
      m.Set("type", Napi::Number::New(env, bpf_map__type(map)));
      m.Set("keySize", Napi::Number::New(env, bpf_map__key_size(map)));
      m.Set("valueSize", Napi::Number::New(env, bpf_map__value_size(map)));
      m.Set("maxEntries", Napi::Number::New(env, bpf_map__max_entries(map)));
      int fd = state_ == State::Loaded ? bpf_map__fd(map) : -1;
      m.Set("fd", Napi::Number::New(env, fd < 0 ? -1 : fd));
      const char* pin = bpf_map__pin_path(map);
      m.Set("pinPath", pin ? Napi::Value(Napi::String::New(env, pin)) : env.Null());
      out.Set(i++, m);
    }
    return out;
  }

  void Close(const Napi::CallbackInfo& info) {
    if (state_ == State::Closed) return;  // idempotent
    Require(info.Env(), "close()", {State::Opened, State::Loaded, State::LoadFailed});
    bpf_object__close(obj_);
    obj_ = nullptr;
    state_ = State::Closed;
  }

  std::string path_;
  bpf_object* obj_ = nullptr;
  State state_ = State::Closed;

};

// bpf_object__load on a libuv worker thread; verifier/libbpf output captured.
class LoadWorker : public Napi::AsyncWorker {
 public:
  LoadWorker(BpfObjectWrap* w, Napi::Object self)
      : Napi::AsyncWorker(self.Env(), "meshcap:bpf_object__load"),
        self_(Napi::Persistent(self)),  // keeps the object alive while loading
        w_(w),
        obj_(w->obj()),
        deferred_(Napi::Promise::Deferred::New(self.Env())) {}

  Napi::Promise Promise() { return deferred_.Promise(); }

  void Execute() override {
    LibbpfLogCapture cap;
    SignalsHeld held;  // the verifier's EAGAIN on a pending signal (common.h)
    int r = bpf_object__load(obj_);
    err_ = r < 0 ? ErrOf(r) : 0;
    log_ = cap.text();
  }

  void OnOK() override {
    Napi::Env env = Env();
    Napi::HandleScope scope(env);
    w_->FinishLoad(err_ == 0);
    if (err_ == 0) {
      deferred_.Resolve(env.Undefined());
    } else {
      deferred_.Reject(MakeNativeError(env, err_, "bpf_object__load", w_->path(), &log_));
    }
  }

  void OnError(const Napi::Error& e) override {
    w_->FinishLoad(false);
    deferred_.Reject(e.Value());
  }

 private:
  Napi::ObjectReference self_;
  BpfObjectWrap* w_;
  bpf_object* obj_;
  Napi::Promise::Deferred deferred_;
  int err_ = 0;
  std::string log_;
};

Napi::Value BpfObjectWrap::Load(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Require(env, "load()", {State::Opened});
  state_ = State::Loading;
  auto* worker = new LoadWorker(this, Value());
  Napi::Promise p = worker->Promise();
  worker->Queue();
  return p;
}

// setRodata(varName, value): copy value over a `const volatile` global in the
// object's .rodata, located through the BTF DATASEC (before load only).
void BpfObjectWrap::SetRodata(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string var = ArgString(info, 0, "setRodata", "varName");
  Napi::Buffer<uint8_t> value = ArgBuffer(info, 1, "setRodata", "value");
  Require(env, "setRodata()", {State::Opened});

  const btf* b = bpf_object__btf(obj_);
  if (!b) throw Napi::Error::New(env, "setRodata: " + path_ + " has no BTF (compile with -g)");
  int secId = btf__find_by_name_kind(b, ".rodata", BTF_KIND_DATASEC);
  if (secId < 0) throw Napi::Error::New(env, "setRodata: " + path_ + " has no .rodata section");
  const btf_type* sec = btf__type_by_id(b, static_cast<__u32>(secId));
  const btf_var_secinfo* vsi = btf_var_secinfos(sec);
  const btf_var_secinfo* found = nullptr;
  for (unsigned short i = 0; i < btf_vlen(sec); i++, vsi++) {
    const btf_type* t = btf__type_by_id(b, vsi->type);
    const char* name = t ? btf__name_by_offset(b, t->name_off) : nullptr;
    if (name && var == name) {
      found = vsi;
      break;
    }
  }
  if (!found)
    throw Napi::Error::New(env, "setRodata: variable '" + var + "' not found in .rodata of " +
                                    path_ + " (declare it `const volatile` and use it)");
  if (value.Length() != found->size)
    ThrowType(env, "setRodata: variable '" + var + "' is " + std::to_string(found->size) +
                       " bytes, value is " + std::to_string(value.Length()) + " bytes");

  bpf_map* map;
  bpf_object__for_each_map(map, obj_) {
    if (!bpf_map__is_internal(map) || !EndsWith(bpf_map__name(map), ".rodata")) continue;
    size_t size = 0;
    const void* cur = bpf_map__initial_value(map, &size);
    if (!cur || found->offset + found->size > size)
      throw Napi::Error::New(env, "setRodata: .rodata of " + path_ + " is not writable");
    std::vector<uint8_t> data(static_cast<const uint8_t*>(cur),
                              static_cast<const uint8_t*>(cur) + size);
    std::memcpy(data.data() + found->offset, value.Data(), found->size);
    int r = bpf_map__set_initial_value(map, data.data(), data.size());
    if (r < 0) ThrowNativeError(env, ErrOf(r), "bpf_map__set_initial_value", var);
    return;
  }
  throw Napi::Error::New(env, "setRodata: no .rodata map in " + path_);
}

// setMaxEntries(mapName, n): size a map before load (bpf_map__set_max_entries).
// A pinned map is reused only if its max_entries equals the object's, so the
// loader passes the pinned map's own size here to adopt it.
void BpfObjectWrap::SetMaxEntries(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string name = ArgString(info, 0, "setMaxEntries", "mapName");
  uint32_t n = ArgU32(info, 1, "setMaxEntries", "maxEntries");
  Require(env, "setMaxEntries()", {State::Opened});
  if (n == 0) ThrowType(env, "setMaxEntries: maxEntries must be at least 1 (map " + name + ")");
  bpf_map* map = bpf_object__find_map_by_name(obj_, name.c_str());
  if (!map) ThrowNativeError(env, ENOENT, "bpf_object__find_map_by_name", path_ + ": map " + name);
  int r = bpf_map__set_max_entries(map, n);
  if (r < 0)
    ThrowNativeError(env, ErrOf(r), "bpf_map__set_max_entries",
                     path_ + ": map " + name + " to " + std::to_string(n) + " entries");
}

Napi::Value OpenObject(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = ArgString(info, 0, "openObject", "path");
  Napi::Value pinDir = env.Undefined();
  if (ArgPresent(info, 1)) {
    if (!info[1].IsObject()) ThrowType(env, "openObject: opts must be an object");
    Napi::Value v = info[1].As<Napi::Object>().Get("mapPinDir");
    if (!v.IsUndefined() && !v.IsNull()) {
      if (!v.IsString()) ThrowType(env, "openObject: opts.mapPinDir must be a string");
      pinDir = v;
    }
  }
  return Data(env).bpfObjectCtor.New({Napi::String::New(env, path), pinDir});
}

}  // namespace

void InitBpfObject(Napi::Env env, Napi::Object exports) {
  Napi::Function ctor = BpfObjectWrap::Class(env);
  Data(env).bpfObjectCtor = Napi::Persistent(ctor);
  exports.Set("BpfObject", ctor);
  exports.Set("openObject", Napi::Function::New(env, OpenObject, "openObject"));
}

}  // namespace meshcap
