// ProgTemplate: one program of a BPF object loaded once through libbpf, then
// loaded again per instance as raw instructions with one 64-bit immediate
// replaced (a pod's inbound stub with its netns cookie: issue 19). After
// bpf_object__load, bpf_program__insns() are the final instructions libbpf
// gave the kernel, with the maps' fds embedded; the object stays open so
// those fds stay valid for every later instance. A raw BPF_PROG_LOAD skips
// the ELF parse, BTF load and internal map creation of a libbpf load.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <vector>

#include "common.h"
#include "libbpf_log.h"

namespace meshcap {

namespace {

const uint8_t kLdImm64 = BPF_LD | BPF_DW | BPF_IMM;

std::string Hex(uint64_t v) {
  char b[24];
  snprintf(b, sizeof b, "0x%016llx", static_cast<unsigned long long>(v));
  return b;
}

uint64_t ArgU64(const Napi::CallbackInfo& info, size_t i, const char* fn, const char* name) {
  if (info.Length() <= i || !info[i].IsBigInt()) ThrowType(info.Env(), std::string(fn) + ": " + name + " must be a bigint");
  bool lossless = false;
  uint64_t v = info[i].As<Napi::BigInt>().Uint64Value(&lossless);
  if (!lossless) ThrowType(info.Env(), std::string(fn) + ": " + name + " must fit in 64 bits, unsigned");
  return v;
}

std::string OptString(Napi::Env env, Napi::Object o, const char* key) {
  Napi::Value v = o.Get(key);
  if (!v.IsString()) ThrowType(env, std::string("ProgTemplate: opts.") + key + " must be a string");
  return v.As<Napi::String>().Utf8Value();
}

class ProgTemplateWrap : public Napi::ObjectWrap<ProgTemplateWrap> {
 public:
  static Napi::Function Class(Napi::Env env) {
    return DefineClass(env, "ProgTemplate",
                       {InstanceAccessor<&ProgTemplateWrap::InsnCount>("insnCount"),
                        InstanceAccessor<&ProgTemplateWrap::ProgFd>("progFd"),
                        InstanceMethod<&ProgTemplateWrap::Instantiate>("instantiate"),
                        InstanceMethod<&ProgTemplateWrap::Close>("close")});
  }

  // new ProgTemplate(path, { mapPinDir, program, magic, license })
  explicit ProgTemplateWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ProgTemplateWrap>(info) {
    Napi::Env env = info.Env();
    path_ = ArgString(info, 0, "ProgTemplate", "path");
    if (info.Length() < 2 || !info[1].IsObject()) ThrowType(env, "ProgTemplate: opts must be an object");
    Napi::Object o = info[1].As<Napi::Object>();
    std::string pinDir = OptString(env, o, "mapPinDir");
    progName_ = OptString(env, o, "program");
    license_ = OptString(env, o, "license");
    Napi::Value m = o.Get("magic");
    if (!m.IsBigInt()) ThrowType(env, "ProgTemplate: opts.magic must be a bigint");
    bool lossless = false;
    magic_ = m.As<Napi::BigInt>().Uint64Value(&lossless);
    if (!lossless) ThrowType(env, "ProgTemplate: opts.magic must fit in 64 bits, unsigned");
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
      int r = bpf_object__load(obj_);
      if (r < 0) ThrowNativeError(env, ErrOf(r), "bpf_object__load", path_, &cap.text());
      const bpf_insn* insns = bpf_program__insns(prog);
      size_t n = bpf_program__insn_cnt(prog);
      if (!insns || n == 0)
        throw Napi::Error::New(env, "ProgTemplate: " + path_ + ": libbpf kept no instructions of " + progName_ + " after load");
      insns_.assign(insns, insns + n);
      progFd_ = bpf_program__fd(prog);
      type_ = bpf_program__type(prog);
      attach_ = bpf_program__expected_attach_type(prog);
      FindMagic(env);
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
  // Exactly one ld_imm64 with src_reg 0 (a plain constant, not a map or BTF
  // reference) whose 64-bit immediate is the magic; anything else refuses.
  void FindMagic(Napi::Env env) {
    int found = 0;
    for (size_t i = 0; i + 1 < insns_.size(); i++) {
      if (insns_[i].code != kLdImm64) continue;
      uint64_t v = static_cast<uint32_t>(insns_[i].imm) | static_cast<uint64_t>(static_cast<uint32_t>(insns_[i + 1].imm)) << 32;
      if (insns_[i].src_reg == 0 && v == magic_) {
        magicIdx_ = i;
        found++;
      }
      i++;  // the second half of ld_imm64
    }
    if (found != 1)
      throw Napi::Error::New(env, "ProgTemplate: " + path_ + ": program " + progName_ + " has " + std::to_string(found) +
                                      " ld_imm64 of the magic " + Hex(magic_) +
                                      ", expected exactly one (an object from another build? rebuild: npm run setup)");
  }

  void Require(Napi::Env env, const char* op) {
    if (!obj_) throw Napi::Error::New(env, "ProgTemplate " + path_ + ": " + op + " after close()");
  }

  Napi::Value InsnCount(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(insns_.size()));
  }

  Napi::Value ProgFd(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), obj_ ? progFd_ : -1);
  }

  // instantiate(value: bigint) -> prog fd (the caller's to close): the
  // template's instructions with the magic replaced by value, one BPF_PROG_LOAD.
  Napi::Value Instantiate(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    uint64_t v = ArgU64(info, 0, "instantiate", "value");
    Require(env, "instantiate()");
    std::vector<bpf_insn> insns(insns_);
    insns[magicIdx_].imm = static_cast<int32_t>(static_cast<uint32_t>(v));
    insns[magicIdx_ + 1].imm = static_cast<int32_t>(static_cast<uint32_t>(v >> 32));
    LIBBPF_OPTS(bpf_prog_load_opts, o, .expected_attach_type = attach_);
    int fd = bpf_prog_load(type_, progName_.c_str(), license_.c_str(), insns.data(), insns.size(), &o);
    if (fd >= 0) return Napi::Number::New(env, fd);
    int err = ErrOf(fd);
    // Again with the verifier's log, for the error only.
    std::vector<char> log(64 * 1024);
    LIBBPF_OPTS(bpf_prog_load_opts, lo, .expected_attach_type = attach_, .log_level = 1,
                .log_size = static_cast<__u32>(log.size()), .log_buf = log.data());
    int fd2 = bpf_prog_load(type_, progName_.c_str(), license_.c_str(), insns.data(), insns.size(), &lo);
    if (fd2 >= 0) close(fd2);
    std::string text(log.data());
    ThrowNativeError(env, err, "bpf_prog_load", path_ + ": " + progName_ + " (from its template, value " + Hex(v) + ")", &text);
  }

  void Close(const Napi::CallbackInfo&) {
    if (obj_) bpf_object__close(obj_);  // the template's map fds; instances hold their own references
    obj_ = nullptr;
  }

  std::string path_, progName_, license_;
  uint64_t magic_ = 0;
  bpf_object* obj_ = nullptr;
  std::vector<bpf_insn> insns_;
  size_t magicIdx_ = 0;
  int progFd_ = -1;
  bpf_prog_type type_ = BPF_PROG_TYPE_UNSPEC;
  bpf_attach_type attach_ = BPF_CGROUP_INET_INGRESS;
};

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

}  // namespace

void InitProgTemplate(Napi::Env env, Napi::Object exports) {
  exports.Set("ProgTemplate", ProgTemplateWrap::Class(env));
  exports.Set("progMapIds", Napi::Function::New(env, ProgMapIds, "progMapIds"));
  exports.Set("progGetFdById", Napi::Function::New(env, ProgGetFdById, "progGetFdById"));
}

}  // namespace meshcap
