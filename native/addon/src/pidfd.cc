// takeFd(pid, fd): a duplicate of another process's file descriptor, through
// pidfd_open + pidfd_getfd (Linux 5.6). The agent uses it to re-register a
// running proxy's inbound listener in mc_listen after the maps were recreated:
// the listener exists only as an fd inside the proxy, and a sockhash can only
// be filled from userspace with an fd of our own.
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <fcntl.h>

#include "common.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace meshcap {

namespace {

Napi::Value TakeFd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t pid = ArgU32(info, 0, "takeFd", "pid");
  int32_t fd = ArgFd(info, 1, "takeFd", "fd");
  const std::string what = "fd " + std::to_string(fd) + " of pid " + std::to_string(pid);
  long pidfd = syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0);
  if (pidfd < 0) ThrowNativeError(env, errno, "pidfd_open", what);
  long dup = syscall(SYS_pidfd_getfd, static_cast<int>(pidfd), fd, 0);
  int err = errno;
  close(static_cast<int>(pidfd));
  if (dup < 0) ThrowNativeError(env, err, "pidfd_getfd", what);
  // pidfd_getfd sets O_CLOEXEC on the new fd already.
  return Napi::Number::New(env, static_cast<double>(dup));
}

}  // namespace

void InitPidfd(Napi::Env env, Napi::Object exports) {
  exports.Set("takeFd", Napi::Function::New(env, TakeFd, "takeFd"));
}

}  // namespace meshcap
