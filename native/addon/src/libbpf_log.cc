// libbpf print callback: routes each message to the capture active on the
// printing thread, else to a bounded, mutex-protected backlog that JS drains
// with takeLibbpfLog() (so warnings from e.g. probes are not lost or printed
// to stderr behind the logger's back).
#include "libbpf_log.h"

#include <bpf/libbpf.h>

#include <cstdarg>
#include <cstdio>
#include <mutex>

#include "common.h"

namespace meshcap {

static thread_local LibbpfLogCapture* tl_capture = nullptr;
static std::mutex g_backlog_mu;
static std::string g_backlog;
static constexpr size_t kBacklogMax = 64 * 1024;
static constexpr size_t kCaptureMax = 4 * 1024 * 1024;  // verifier logs can be large

LibbpfLogCapture::LibbpfLogCapture() : prev_(tl_capture) { tl_capture = this; }
LibbpfLogCapture::~LibbpfLogCapture() { tl_capture = prev_; }

void LibbpfLogCapture::Append(const char* s, size_t n) {
  if (text_.size() + n <= kCaptureMax) text_.append(s, n);
}

static int Print(enum libbpf_print_level level, const char* fmt, va_list args) {
  if (level == LIBBPF_DEBUG) return 0;
  char small[512];
  va_list copy;
  va_copy(copy, args);
  int n = vsnprintf(small, sizeof(small), fmt, copy);
  va_end(copy);
  if (n < 0) return 0;
  std::string msg;
  if (static_cast<size_t>(n) < sizeof(small)) {
    msg.assign(small, static_cast<size_t>(n));
  } else {
    msg.resize(static_cast<size_t>(n) + 1);
    vsnprintf(msg.data(), msg.size(), fmt, args);
    msg.resize(static_cast<size_t>(n));
  }
  if (tl_capture) {
    tl_capture->Append(msg.data(), msg.size());
  } else {
    std::lock_guard<std::mutex> lock(g_backlog_mu);
    if (g_backlog.size() + msg.size() > kBacklogMax)
      g_backlog.erase(0, std::min(g_backlog.size(), g_backlog.size() + msg.size() - kBacklogMax));
    g_backlog.append(msg);
  }
  return n;
}

static Napi::Value TakeLibbpfLog(const Napi::CallbackInfo& info) {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(g_backlog_mu);
    out.swap(g_backlog);
  }
  return Napi::String::New(info.Env(), out);
}

static Napi::Value LibbpfVersion(const Napi::CallbackInfo& info) {
  return Napi::String::New(info.Env(), libbpf_version_string());
}

void InitLibbpfLog(Napi::Env env, Napi::Object exports) {
  libbpf_set_print(Print);
  exports.Set("takeLibbpfLog", Napi::Function::New(env, TakeLibbpfLog, "takeLibbpfLog"));
  exports.Set("libbpfVersion", Napi::Function::New(env, LibbpfVersion, "libbpfVersion"));
}

}  // namespace meshcap
