// netnsCookie(path): the kernel's unique 64-bit id of a network namespace,
// which the BPF programs read with bpf_get_netns_cookie(), so agent and
// datapath key a pod the same way.
// netnsReadSysctl(path, file): a /proc/sys/net file as that namespace has it
// (its net sysctls are the reading thread's namespace's).
#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <thread>

#include "common.h"

#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71
#endif

namespace meshcap {

namespace {

class NetnsCookieWorker : public Napi::AsyncWorker {
 public:
  NetnsCookieWorker(Napi::Env env, std::string path, std::string file = "")
      : Napi::AsyncWorker(env, "meshcap:netnsCookie"),
        path_(std::move(path)),
        file_(std::move(file)),
        deferred_(Napi::Promise::Deferred::New(env)) {}

  Napi::Promise Promise() { return deferred_.Promise(); }

  void Execute() override {
    // setns() switches the calling thread; do it on a throwaway thread so no
    // libuv pool thread (or the JS thread) ever runs in a pod's namespace.
    std::thread t([this] { Lookup(); });
    t.join();
  }

  void OnOK() override {
    Napi::Env env = Env();
    Napi::HandleScope scope(env);
    if (err_) deferred_.Reject(MakeNativeError(env, err_, syscall_, file_.empty() ? path_ : path_ + ": " + file_));
    else if (!file_.empty()) deferred_.Resolve(Napi::String::New(env, text_));
    else deferred_.Resolve(Napi::BigInt::New(env, cookie_));
  }

  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

 private:
  void Fail(const char* syscall) {
    err_ = errno;
    syscall_ = syscall;
  }

  void Lookup() {
    int ns = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0) return Fail("open");
    int r = setns(ns, CLONE_NEWNET);
    if (r < 0) {
      Fail("setns");
      close(ns);
      return;
    }
    close(ns);
    if (!file_.empty()) return Read();
    int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return Fail("socket");
    uint64_t cookie = 0;
    socklen_t len = sizeof(cookie);
    if (getsockopt(s, SOL_SOCKET, SO_NETNS_COOKIE, &cookie, &len) < 0) Fail("getsockopt(SO_NETNS_COOKIE)");
    else cookie_ = cookie;
    close(s);
  }

  void Read() {
    int fd = open(file_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Fail("open");
    char buf[256];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) Fail("read");
    else text_.assign(buf, static_cast<size_t>(n));
    close(fd);
  }

  std::string path_;
  std::string file_;
  std::string text_;
  Napi::Promise::Deferred deferred_;
  int err_ = 0;
  const char* syscall_ = "";
  uint64_t cookie_ = 0;
};

Napi::Value NetnsCookie(const Napi::CallbackInfo& info) {
  std::string path = ArgString(info, 0, "netnsCookie", "netnsPath");
  auto* w = new NetnsCookieWorker(info.Env(), path);
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

Napi::Value NetnsReadSysctl(const Napi::CallbackInfo& info) {
  std::string path = ArgString(info, 0, "netnsReadSysctl", "netnsPath");
  std::string file = ArgString(info, 1, "netnsReadSysctl", "file");
  // only the namespace's own net sysctls: nothing else is read in a pod's netns
  if (file.rfind("/proc/sys/net/", 0) != 0 || file.find("..") != std::string::npos)
    ThrowType(info.Env(), "netnsReadSysctl: file must be under /proc/sys/net/, got " + file);
  auto* w = new NetnsCookieWorker(info.Env(), path, file);
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

}  // namespace

void InitNetnsCookie(Napi::Env env, Napi::Object exports) {
  exports.Set("netnsCookie", Napi::Function::New(env, NetnsCookie, "netnsCookie"));
  exports.Set("netnsReadSysctl", Napi::Function::New(env, NetnsReadSysctl, "netnsReadSysctl"));
}

}  // namespace meshcap
