// NativeError construction and argument validation.
#include <bpf/libbpf.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <unistd.h>

#include "common.h"

namespace meshcap {

std::string ErrnoName(int err) {
  // Kernel-internal codes that leak to userspace from BPF syscalls and have no
  // glibc name.
  switch (err) {
    case 512: return "ERESTARTSYS";
    case 524: return "ENOTSUPP";
  }
  if (err >= 4000 && err < 4100) {
    static const char* const names[] = {"LIBBPF_ERRNO__LIBELF", "LIBBPF_ERRNO__FORMAT",
                                        "LIBBPF_ERRNO__KVERSION", "LIBBPF_ERRNO__ENDIAN",
                                        "LIBBPF_ERRNO__INTERNAL", "LIBBPF_ERRNO__RELOC",
                                        "LIBBPF_ERRNO__LOAD", "LIBBPF_ERRNO__VERIFY",
                                        "LIBBPF_ERRNO__PROG2BIG", "LIBBPF_ERRNO__KVER",
                                        "LIBBPF_ERRNO__PROGTYPE", "LIBBPF_ERRNO__WRNGPID",
                                        "LIBBPF_ERRNO__INVSEQ", "LIBBPF_ERRNO__NLPARSE"};
    size_t i = static_cast<size_t>(err - 4000);
    if (i < sizeof(names) / sizeof(names[0])) return names[i];
  }
  const char* n = strerrorname_np(err);
  return n ? n : "E" + std::to_string(err);
}

std::string ErrnoText(int err) {
  char buf[256];
  if (libbpf_strerror(err, buf, sizeof(buf)) == 0) return buf;
  return std::string("errno ") + std::to_string(err);
}

Napi::Value MakeNativeError(Napi::Env env, int err, const std::string& syscall,
                            const std::string& object, const std::string* log) {
  Napi::Object init = Napi::Object::New(env);
  init.Set("errno", Napi::Number::New(env, err));
  init.Set("code", Napi::String::New(env, ErrnoName(err)));
  init.Set("syscall", Napi::String::New(env, syscall));
  init.Set("detail", Napi::String::New(env, ErrnoText(err)));
  if (!object.empty()) init.Set("object", Napi::String::New(env, object));
  if (log) init.Set("log", Napi::String::New(env, *log));
  AddonData& d = Data(env);
  if (!d.errorFactory.IsEmpty()) return d.errorFactory.Call({init});
  // Factory not registered (addon used without src/native/addon.ts): a plain
  // Error carrying the same fields.
  std::string msg = syscall + (object.empty() ? "" : " " + object) + ": " + ErrnoText(err) +
                    " (" + ErrnoName(err) + ")";
  Napi::Object e = Napi::Error::New(env, msg).Value();
  for (const char* k : {"errno", "code", "syscall", "object", "log"})
    if (init.Has(k)) e.Set(k, init.Get(k));
  return e;
}

void ThrowNativeError(Napi::Env env, int err, const std::string& syscall,
                      const std::string& object, const std::string* log) {
  throw Napi::Error(env, MakeNativeError(env, err, syscall, object, log));
}

void ThrowType(Napi::Env env, const std::string& msg) { throw Napi::TypeError::New(env, msg); }

bool ArgPresent(const Napi::CallbackInfo& info, size_t i) {
  return i < info.Length() && !info[i].IsUndefined() && !info[i].IsNull();
}

static std::string Where(const char* fn, const char* name) {
  return std::string(fn) + ": " + name;
}

static double ArgInteger(const Napi::CallbackInfo& info, size_t i, const char* fn,
                         const char* name, double lo, double hi) {
  if (i >= info.Length() || !info[i].IsNumber())
    ThrowType(info.Env(), Where(fn, name) + " must be a number");
  double v = info[i].As<Napi::Number>().DoubleValue();
  if (!std::isfinite(v) || std::trunc(v) != v || v < lo || v > hi)
    ThrowType(info.Env(), Where(fn, name) + " must be an integer in [" +
                              std::to_string(static_cast<long long>(lo)) + ", " +
                              std::to_string(static_cast<long long>(hi)) + "], got " +
                              info[i].ToString().Utf8Value());
  return v;
}

int32_t ArgFd(const Napi::CallbackInfo& info, size_t i, const char* fn, const char* name) {
  return static_cast<int32_t>(ArgInteger(info, i, fn, name, 0, INT32_MAX));
}

uint32_t ArgU32(const Napi::CallbackInfo& info, size_t i, const char* fn, const char* name) {
  return static_cast<uint32_t>(ArgInteger(info, i, fn, name, 0, UINT32_MAX));
}

std::string ArgString(const Napi::CallbackInfo& info, size_t i, const char* fn,
                      const char* name) {
  if (i >= info.Length() || !info[i].IsString())
    ThrowType(info.Env(), Where(fn, name) + " must be a string");
  std::string s = info[i].As<Napi::String>().Utf8Value();
  if (s.empty()) ThrowType(info.Env(), Where(fn, name) + " must not be empty");
  if (s.find('\0') != std::string::npos)
    ThrowType(info.Env(), Where(fn, name) + " must not contain NUL bytes");
  return s;
}

Napi::Buffer<uint8_t> ArgBuffer(const Napi::CallbackInfo& info, size_t i, const char* fn,
                                const char* name) {
  if (i >= info.Length() || !info[i].IsBuffer())
    ThrowType(info.Env(), Where(fn, name) + " must be a Buffer");
  return info[i].As<Napi::Buffer<uint8_t>>();
}

void RequireBpfFd(Napi::Env env, int fd, const char* kind, const char* fn) {
  char link[64], target[128];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof(target) - 1);
  if (n < 0) ThrowNativeError(env, EBADF, fn, "fd " + std::to_string(fd));
  target[n] = 0;
  // The kernel names a new link's file "bpf_link" but a link fd from
  // bpf_obj_get "bpf-link": accept both spellings.
  std::string want = std::string("anon_inode:") + kind, got = target;
  for (auto& c : want) if (c == '_') c = '-';
  for (auto& c : got) if (c == '_') c = '-';
  if (want != got)
    ThrowType(env, std::string(fn) + ": fd " + std::to_string(fd) + " is not a " + kind +
                       " (it is " + target + ")");
}

// _setErrorFactory(fn): src/native/addon.ts registers (init) => new NativeError(init).
static void SetErrorFactory(const Napi::CallbackInfo& info) {
  if (info.Length() < 1 || !info[0].IsFunction())
    ThrowType(info.Env(), "_setErrorFactory: factory must be a function");
  Data(info.Env()).errorFactory = Napi::Persistent(info[0].As<Napi::Function>());
}

void InitErrors(Napi::Env env, Napi::Object exports) {
  exports.Set("_setErrorFactory", Napi::Function::New(env, SetErrorFactory, "_setErrorFactory"));
}

}  // namespace meshcap
