// Shared helpers for the meshcap addon: argument checks (TypeError on bad
// input, never a crash) and the one way every syscall/libbpf failure reaches
// JavaScript (NativeError, see native_error.cc and src/native/errors.ts).
#pragma once
#include <napi.h>
#include <pthread.h>

#include <csignal>
#include <cstdint>
#include <string>

namespace meshcap {

// Per-environment state: the JS factory that builds NativeError instances
// (registered by src/native/addon.ts) and the BpfObject class constructor.
struct AddonData {
  Napi::FunctionReference errorFactory;
  Napi::FunctionReference bpfObjectCtor;
};
AddonData& Data(Napi::Env env);

// Builds a NativeError value. err is a positive errno (or libbpf's 4000+
// codes); syscall names the failing call; object the program/map/path.
Napi::Value MakeNativeError(Napi::Env env, int err, const std::string& syscall,
                            const std::string& object, const std::string* log = nullptr);
[[noreturn]] void ThrowNativeError(Napi::Env env, int err, const std::string& syscall,
                                   const std::string& object, const std::string* log = nullptr);
// Errno of a libbpf call that returned ret (< 0): libbpf 1.x returns -errno.
inline int ErrOf(long ret) { return ret < 0 ? static_cast<int>(-ret) : errno; }

// Holds the calling thread's asynchronous signals for a scope that loads BPF
// programs. The verifier gives up with EAGAIN whenever a signal is pending
// for the thread it runs on (kernel/bpf/verifier.c, do_check), and libbpf
// tries a load only 5 times: under a profiler's SIGPROF, or any signal storm,
// a pod's stub load failed its ADD, and a failed feature probe would have
// sent the node to iptables mode. Held, a signal waits out the load (a few
// hundred microseconds for a stub) and is delivered when the mask is
// restored; a process-directed one may go to another thread meanwhile.
// SIGKILL still interrupts; faults (SIGSEGV, ...) are left unheld.
class SignalsHeld {
 public:
  SignalsHeld() {
    sigset_t set;
    sigfillset(&set);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS}) sigdelset(&set, sig);
    held_ = pthread_sigmask(SIG_BLOCK, &set, &old_) == 0;
  }
  ~SignalsHeld() {
    if (held_) pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SignalsHeld(const SignalsHeld&) = delete;
  SignalsHeld& operator=(const SignalsHeld&) = delete;

 private:
  sigset_t old_;
  bool held_ = false;
};

// errno -> symbolic name ("EPERM", "ENOTSUPP", "LIBBPF_ERRNO__VERIFY", ...).
std::string ErrnoName(int err);
std::string ErrnoText(int err);

[[noreturn]] void ThrowType(Napi::Env env, const std::string& msg);

// Argument accessors: fn is the JS function name used in messages.
int32_t ArgFd(const Napi::CallbackInfo& info, size_t i, const char* fn, const char* name);
uint32_t ArgU32(const Napi::CallbackInfo& info, size_t i, const char* fn, const char* name);
std::string ArgString(const Napi::CallbackInfo& info, size_t i, const char* fn, const char* name);
Napi::Buffer<uint8_t> ArgBuffer(const Napi::CallbackInfo& info, size_t i, const char* fn,
                                const char* name);
bool ArgPresent(const Napi::CallbackInfo& info, size_t i);

// Checks that fd is a BPF object of the given kind ("bpf-link", "bpf-prog",
// "bpf-map"): bpf_obj_get_info_by_fd fills whatever struct the fd really is,
// so a prog fd passed to linkInfo() would otherwise be decoded as garbage.
void RequireBpfFd(Napi::Env env, int fd, const char* kind, const char* fn);

// Module parts; each adds its functions to exports.
void InitErrors(Napi::Env env, Napi::Object exports);
void InitLibbpfLog(Napi::Env env, Napi::Object exports);
void InitBpfObject(Napi::Env env, Napi::Object exports);
void InitLinks(Napi::Env env, Napi::Object exports);
void InitMaps(Napi::Env env, Napi::Object exports);
void InitInfo(Napi::Env env, Napi::Object exports);
void InitProbes(Napi::Env env, Napi::Object exports);
void InitNetnsCookie(Napi::Env env, Napi::Object exports);
void InitNetnsRoutes(Napi::Env env, Napi::Object exports);
void InitOrigDst(Napi::Env env, Napi::Object exports);
void InitPidfd(Napi::Env env, Napi::Object exports);
void InitConsts(Napi::Env env, Napi::Object exports);
void InitProgTemplate(Napi::Env env, Napi::Object exports);
void InitMemory(Napi::Env env, Napi::Object exports);
void InitCniListener(Napi::Env env, Napi::Object exports);

}  // namespace meshcap
