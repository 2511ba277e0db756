// ProgTemplate: one program of a BPF object loaded once through libbpf, then
// loaded again per instance as raw instructions, each instance with a fresh
// copy of the object's .bss (a pod's inbound stub with its own 1-entry array
// holding its netns cookie: issue 19). After bpf_object__load,
// bpf_program__insns() are the final instructions libbpf gave the kernel, with
// the maps' fds embedded; the object stays open so those fds stay valid for
// every later instance. Per instance: one BPF_MAP_CREATE, the one ld_imm64 of
// the .bss pointed at it, one BPF_PROG_LOAD; a raw load skips the ELF parse,
// BTF load and internal map creation of a libbpf load.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common.h"
#include "libbpf_log.h"

namespace meshcap {

namespace {

const uint8_t kLdImm64 = BPF_LD | BPF_DW | BPF_IMM;

std::string OptString(Napi::Env env, Napi::Object o, const char* key) {
  Napi::Value v = o.Get(key);
  if (!v.IsString()) ThrowType(env, std::string("ProgTemplate: opts.") + key + " must be a string");
  return v.As<Napi::String>().Utf8Value();
}

// What one instance load needs, copied from the template so that a worker
// thread never touches the wrap (the JS thread may close it meanwhile: close()
// then waits for the loads in flight, see ProgTemplateWrap::Close).
struct InstanceSpec {
  std::vector<bpf_insn> insns;
  size_t mapIdx = 0;
  __u32 valueSize = 0;
  bpf_prog_type type = BPF_PROG_TYPE_UNSPEC;
  bpf_attach_type attach = BPF_CGROUP_INET_INGRESS;
  std::string progName, license;
};

// The outcome of one instance load: fds on success, else errno, the call that
// failed and the verifier's log (for the NativeError, built on the JS thread).
struct InstanceResult {
  int progFd = -1, mapFd = -1, err = 0;
  const char* syscall = "";
  std::string log;
};

// A fresh 1-entry array (zeroed) in place of the template's .bss, one
// BPF_PROG_LOAD; on a refused load, again with the verifier's log. No N-API:
// runs on the JS thread (instantiate) or a libuv worker (instantiateAsync).
InstanceResult LoadInstance(InstanceSpec& s) {
  SignalsHeld held;  // the verifier's EAGAIN on a pending signal (common.h)
  InstanceResult r;
  r.mapFd = bpf_map_create(BPF_MAP_TYPE_ARRAY, "mc_stub_netns", 4, s.valueSize, 1, nullptr);
  if (r.mapFd < 0) {
    r.err = ErrOf(r.mapFd);
    r.syscall = "bpf_map_create";
    r.mapFd = -1;
    return r;
  }
  s.insns[s.mapIdx].imm = r.mapFd;
  LIBBPF_OPTS(bpf_prog_load_opts, o, .expected_attach_type = s.attach);
  r.progFd = bpf_prog_load(s.type, s.progName.c_str(), s.license.c_str(), s.insns.data(), s.insns.size(), &o);
  if (r.progFd >= 0) return r;
  r.err = ErrOf(r.progFd);
  r.progFd = -1;
  r.syscall = "bpf_prog_load";
  std::vector<char> log(64 * 1024);
  LIBBPF_OPTS(bpf_prog_load_opts, lo, .expected_attach_type = s.attach, .log_level = 1,
              .log_size = static_cast<__u32>(log.size()), .log_buf = log.data());
  int fd2 = bpf_prog_load(s.type, s.progName.c_str(), s.license.c_str(), s.insns.data(), s.insns.size(), &lo);
  if (fd2 >= 0) close(fd2);
  close(r.mapFd);
  r.mapFd = -1;
  r.log.assign(log.data());
  return r;
}

class ProgTemplateWrap;

// instantiateAsync's work on a libuv worker thread.
class InstantiateWorker : public Napi::AsyncWorker {
 public:
  InstantiateWorker(ProgTemplateWrap* w, Napi::Object self, InstanceSpec spec);
  Napi::Promise Promise() { return deferred_.Promise(); }
  void Execute() override { r_ = LoadInstance(spec_); }
  void OnOK() override;
  void OnError(const Napi::Error& e) override;

 private:
  Napi::ObjectReference self_;
  ProgTemplateWrap* w_;
  InstanceSpec spec_;
  InstanceResult r_;
  Napi::Promise::Deferred deferred_;
};

class ProgTemplateWrap : public Napi::ObjectWrap<ProgTemplateWrap> {
 public:
  static Napi::Function Class(Napi::Env env) {
    return DefineClass(env, "ProgTemplate",
                       {InstanceAccessor<&ProgTemplateWrap::InsnCount>("insnCount"),
                        InstanceAccessor<&ProgTemplateWrap::ProgFd>("progFd"),
                        InstanceMethod<&ProgTemplateWrap::Instantiate>("instantiate"),
                        InstanceMethod<&ProgTemplateWrap::InstantiateAsync>("instantiateAsync"),
                        InstanceMethod<&ProgTemplateWrap::Close>("close")});
  }

  // new ProgTemplate(path, { mapPinDir, program, license })
  explicit ProgTemplateWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ProgTemplateWrap>(info) {
    Napi::Env env = info.Env();
    path_ = ArgString(info, 0, "ProgTemplate", "path");
    if (info.Length() < 2 || !info[1].IsObject()) ThrowType(env, "ProgTemplate: opts must be an object");
    Napi::Object o = info[1].As<Napi::Object>();
    std::string pinDir = OptString(env, o, "mapPinDir");
    progName_ = OptString(env, o, "program");
    license_ = OptString(env, o, "license");
    while (pinDir.size() > 1 && pinDir.back() == '/') pinDir.pop_back();

    LibbpfLogCapture cap;
    errno = 0;
    obj_ = bpf_object__open_file(path_.c_str(), nullptr);
    if (!obj_) ThrowNativeError(env, errno ? errno : EINVAL, "bpf_object__open_file", path_, &cap.text());
    try {
      bpf_map* map;
      bpf_object__for_each_map(map, obj_) {
        if (bpf_map__is_internal(map)) continue;  // as BpfObject: never pin per-load data
        std::string pin = pinDir + "/" + bpf_map__name(map);
        int r = bpf_map__set_pin_path(map, pin.c_str());
        if (r < 0) ThrowNativeError(env, ErrOf(r), "bpf_map__set_pin_path", pin, &cap.text());
      }
      bpf_program* prog = bpf_object__find_program_by_name(obj_, progName_.c_str());
      if (!prog) ThrowNativeError(env, ENOENT, "bpf_object__find_program_by_name", path_ + ": program " + progName_);
      int r;
      {
        SignalsHeld held;
        r = bpf_object__load(obj_);
      }
      if (r < 0) ThrowNativeError(env, ErrOf(r), "bpf_object__load", path_, &cap.text());
      const bpf_insn* insns = bpf_program__insns(prog);
      size_t n = bpf_program__insn_cnt(prog);
      if (!insns || n == 0)
        throw Napi::Error::New(env, "ProgTemplate: " + path_ + ": libbpf kept no instructions of " + progName_ + " after load");
      insns_.assign(insns, insns + n);
      progFd_ = bpf_program__fd(prog);
      type_ = bpf_program__type(prog);
      attach_ = bpf_program__expected_attach_type(prog);
      FindBss(env);
    } catch (...) {
      bpf_object__close(obj_);
      obj_ = nullptr;
      throw;
    }
  }

  ~ProgTemplateWrap() override {
    if (obj_) bpf_object__close(obj_);
  }

 private:
  // The object's .bss (an internal 1-entry array) and exactly one ld_imm64
  // referencing it (BPF_PSEUDO_MAP_VALUE, or _FD) in the program; else a refusal.
  void FindBss(Napi::Env env) {
    int bssFd = -1;
    bpf_map* map;
    bpf_object__for_each_map(map, obj_) {
      std::string n = bpf_map__name(map);
      if (bpf_map__is_internal(map) && n.size() >= 4 && n.compare(n.size() - 4, 4, ".bss") == 0) {
        bssFd = bpf_map__fd(map);
        valueSize_ = bpf_map__value_size(map);
      }
    }
    int found = 0;
    for (size_t i = 0; bssFd >= 0 && i + 1 < insns_.size(); i++) {
      if (insns_[i].code != kLdImm64) continue;
      if ((insns_[i].src_reg == BPF_PSEUDO_MAP_VALUE || insns_[i].src_reg == BPF_PSEUDO_MAP_FD) && insns_[i].imm == bssFd) {
        mapIdx_ = i;
        found++;
      }
      i++;  // the second half of ld_imm64
    }
    if (found != 1)
      throw Napi::Error::New(env, "ProgTemplate: " + path_ + ": program " + progName_ + " has " + std::to_string(found) +
                                      " ld_imm64 of its object's .bss, expected exactly one (an object from another build? rebuild: npm run setup)");
  }

  void Require(Napi::Env env, const char* op) {
    if (closed_) throw Napi::Error::New(env, "ProgTemplate " + path_ + ": " + op + " after close()");
  }

  Napi::Value InsnCount(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(insns_.size()));
  }

  Napi::Value ProgFd(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), closed_ ? -1 : progFd_);
  }

  // instantiate() -> { progFd, mapFd } (the caller's to close): a fresh
  // 1-entry array (zeroed) in place of the template's .bss, one BPF_PROG_LOAD.
  Napi::Value Instantiate(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Require(env, "instantiate()");
    InstanceSpec spec = Spec();
    InstanceResult r = LoadInstance(spec);
    if (r.err) ThrowNativeError(env, r.err, r.syscall, What(r.syscall), r.log.empty() ? nullptr : &r.log);
    return Fds(env, r);
  }

  // instantiateAsync() -> Promise<{ progFd, mapFd }>: instantiate() on a libuv
  // worker thread, so the verifier and the JIT (~0.3 ms of CPU for the inbound
  // stub) are not on the event loop: the agent's pool refills between ADDs.
  // The template's object (whose map fds the instructions embed) stays open
  // until every load in flight is done, even across close().
  Napi::Value InstantiateAsync(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Require(env, "instantiateAsync()");
    inflight_++;
    auto* worker = new InstantiateWorker(this, Value(), Spec());
    Napi::Promise p = worker->Promise();
    worker->Queue();
    return p;
  }

 public:
  // An instance load in flight ended (InstantiateWorker, JS thread): a close()
  // that came meanwhile closes the object now.
  void Finished() {
    if (--inflight_ == 0 && closed_) CloseObject();
  }

  static Napi::Object Fds(Napi::Env env, const InstanceResult& r) {
    Napi::Object out = Napi::Object::New(env);
    out.Set("progFd", Napi::Number::New(env, r.progFd));
    out.Set("mapFd", Napi::Number::New(env, r.mapFd));
    return out;
  }

  std::string What(const std::string& syscall) const {
    return syscall == "bpf_map_create" ? path_ + ": " + progName_ + "'s own .bss" : path_ + ": " + progName_ + " (from its template)";
  }

 private:
  InstanceSpec Spec() const {
    InstanceSpec s;
    s.insns = insns_;
    s.mapIdx = mapIdx_;
    s.valueSize = valueSize_;
    s.type = type_;
    s.attach = attach_;
    s.progName = progName_;
    s.license = license_;
    return s;
  }

  void Close(const Napi::CallbackInfo&) {
    // the template's map fds; instances hold their own references
    closed_ = true;
    if (inflight_ == 0) CloseObject();
  }

  void CloseObject() {
    if (obj_) bpf_object__close(obj_);
    obj_ = nullptr;
  }

  std::string path_, progName_, license_;
  bpf_object* obj_ = nullptr;
  // instantiateAsync loads not finished yet: a close() meanwhile leaves obj_
  // open until the last one is done (Finished)
  int inflight_ = 0;
  bool closed_ = false;
  std::vector<bpf_insn> insns_;
  size_t mapIdx_ = 0;
  __u32 valueSize_ = 0;
  int progFd_ = -1;
  bpf_prog_type type_ = BPF_PROG_TYPE_UNSPEC;
  bpf_attach_type attach_ = BPF_CGROUP_INET_INGRESS;
};

InstantiateWorker::InstantiateWorker(ProgTemplateWrap* w, Napi::Object self, InstanceSpec spec)
    : Napi::AsyncWorker(self.Env(), "meshcap:prog_template_instantiate"),
      self_(Napi::Persistent(self)),  // keeps the template alive while loading
      w_(w),
      spec_(std::move(spec)),
      deferred_(Napi::Promise::Deferred::New(self.Env())) {}

void InstantiateWorker::OnOK() {
  Napi::Env env = Env();
  Napi::HandleScope scope(env);
  w_->Finished();
  if (r_.err == 0) {
    deferred_.Resolve(ProgTemplateWrap::Fds(env, r_));
  } else {
    deferred_.Reject(MakeNativeError(env, r_.err, r_.syscall, w_->What(r_.syscall), r_.log.empty() ? nullptr : &r_.log));
  }
}

void InstantiateWorker::OnError(const Napi::Error& e) {
  w_->Finished();
  if (r_.progFd >= 0) close(r_.progFd);
  if (r_.mapFd >= 0) close(r_.mapFd);
  deferred_.Reject(e.Value());
}

// progMapIds(fd) -> ids of the maps the program uses (bpf_prog_info.map_ids).
Napi::Value ProgMapIds(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0, "progMapIds", "fd");
  RequireBpfFd(env, fd, "bpf-prog", "progMapIds");
  std::vector<__u32> ids(16);
  for (;;) {
    bpf_prog_info pi = {};
    pi.nr_map_ids = static_cast<__u32>(ids.size());
    pi.map_ids = reinterpret_cast<__u64>(ids.data());
    __u32 len = sizeof pi;
    int r = bpf_obj_get_info_by_fd(fd, &pi, &len);
    if (r < 0) ThrowNativeError(env, ErrOf(r), "bpf_obj_get_info_by_fd", "program fd " + std::to_string(fd));
    if (pi.nr_map_ids <= ids.size()) {
      Napi::Array out = Napi::Array::New(env, pi.nr_map_ids);
      for (__u32 i = 0; i < pi.nr_map_ids; i++) out.Set(i, Napi::Number::New(env, ids[i]));
      return out;
    }
    ids.resize(pi.nr_map_ids);
  }
}

// progGetFdById(id) -> a new fd of the program (the caller closes it).
Napi::Value ProgGetFdById(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t id = ArgU32(info, 0, "progGetFdById", "id");
  int fd = bpf_prog_get_fd_by_id(id);
  if (fd < 0) ThrowNativeError(env, ErrOf(fd), "bpf_prog_get_fd_by_id", "program id " + std::to_string(id));
  return Napi::Number::New(env, fd);
}

// instanceSetU64(mapFd, value): key 0 of an instance's own array := value,
// one BPF_MAP_UPDATE_ELEM after one BPF_OBJ_GET_INFO_BY_FD (the ADD path:
// mapUpdate's fd check reads /proc/self/fd, ~10 us). A non-map fd fails the
// update (EINVAL); a map other than a 1-entry array of 8-byte values is refused.
void InstanceSetU64(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0, "instanceSetU64", "mapFd");
  if (info.Length() < 2 || !info[1].IsBigInt()) ThrowType(env, "instanceSetU64: value must be a bigint");
  bool lossless = false;
  uint64_t v = info[1].As<Napi::BigInt>().Uint64Value(&lossless);
  if (!lossless) ThrowType(env, "instanceSetU64: value must fit in 64 bits, unsigned");
  bpf_map_info mi{};
  __u32 len = sizeof mi;
  int r = bpf_obj_get_info_by_fd(fd, &mi, &len);
  if (r < 0) ThrowNativeError(env, ErrOf(r), "bpf_obj_get_info_by_fd", "map fd " + std::to_string(fd));
  if (mi.type != BPF_MAP_TYPE_ARRAY || mi.key_size != 4 || mi.value_size != 8 || mi.max_entries != 1)
    ThrowType(env, "instanceSetU64: fd " + std::to_string(fd) + " is not a 1-entry array of 8-byte values");
  __u32 key = 0;
  r = bpf_map_update_elem(fd, &key, &v, BPF_ANY);
  if (r < 0) ThrowNativeError(env, ErrOf(r), "bpf_map_update_elem", "map fd " + std::to_string(fd));
}


// progTestRunSkLookup(progFd, { family, remoteIp, remotePort, localIp,
// localPort }) -> { retval, cookie }: one BPF_PROG_TEST_RUN of an sk_lookup
// program for a TCP lookup (5.14+). The kernel runs it in this thread's
// process context, bottom halves enabled (bpf_test_timer: preempt_disable
// only): the loader checks the shared inbound program tells that context from
// a SYN delivery (src/loader/inbound-shared.ts). Addresses: Buffers of 4
// (family 2) or 16 bytes, network order; remotePort host order (converted),
// localPort host order. cookie: the selected socket's cookie, 0n for none.
Napi::Value ProgTestRunSkLookup(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0, "progTestRunSkLookup", "fd");
  if (info.Length() < 2 || !info[1].IsObject()) ThrowType(env, "progTestRunSkLookup: ctx must be an object");
  Napi::Object o = info[1].As<Napi::Object>();
  bpf_sk_lookup ctx{};
  ctx.family = o.Get("family").ToNumber().Uint32Value();
  ctx.protocol = IPPROTO_TCP;
  auto addr = [&](const char* key, __u32* v4, __u32* v6) {
    Napi::Value v = o.Get(key);
    if (!v.IsBuffer()) ThrowType(env, std::string("progTestRunSkLookup: ctx.") + key + " must be a Buffer");
    auto b = v.As<Napi::Buffer<uint8_t>>();
    size_t want = ctx.family == 2 ? 4 : 16;
    if (b.Length() != want) ThrowType(env, std::string("progTestRunSkLookup: ctx.") + key + " must be " + std::to_string(want) + " bytes for this family");
    memcpy(ctx.family == 2 ? v4 : v6, b.Data(), want);
  };
  addr("remoteIp", &ctx.remote_ip4, ctx.remote_ip6);
  addr("localIp", &ctx.local_ip4, ctx.local_ip6);
  ctx.remote_port = htons(static_cast<uint16_t>(o.Get("remotePort").ToNumber().Uint32Value()));
  ctx.local_port = o.Get("localPort").ToNumber().Uint32Value();
  LIBBPF_OPTS(bpf_test_run_opts, t, .ctx_in = &ctx, .ctx_out = &ctx, .ctx_size_in = sizeof ctx, .ctx_size_out = sizeof ctx);
  int r = bpf_prog_test_run_opts(fd, &t);
  if (r < 0) ThrowNativeError(env, ErrOf(r), "bpf_prog_test_run_opts", "sk_lookup program fd " + std::to_string(fd));
  Napi::Object out = Napi::Object::New(env);
  out.Set("retval", Napi::Number::New(env, t.retval));
  out.Set("cookie", Napi::BigInt::New(env, static_cast<uint64_t>(ctx.cookie)));
  return out;
}
}  // namespace

void InitProgTemplate(Napi::Env env, Napi::Object exports) {
  exports.Set("ProgTemplate", ProgTemplateWrap::Class(env));
  exports.Set("progMapIds", Napi::Function::New(env, ProgMapIds, "progMapIds"));
  exports.Set("instanceSetU64", Napi::Function::New(env, InstanceSetU64, "instanceSetU64"));
  exports.Set("progGetFdById", Napi::Function::New(env, ProgGetFdById, "progGetFdById"));
  exports.Set("progTestRunSkLookup", Napi::Function::New(env, ProgTestRunSkLookup, "progTestRunSkLookup"));
}

}  // namespace meshcap
