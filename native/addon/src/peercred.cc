// peerCredentials(fd): the pid, uid and gid of the process at the other end
// of a connected unix socket (SO_PEERCRED: the credentials it had when it
// called connect). Node has no API for it; the agent's CNI socket accepts
// only uid 0 (the container runtime), whatever the socket file's mode.
#include <sys/socket.h>

#include <cerrno>

#include "common.h"

namespace meshcap {

namespace {

Napi::Value PeerCredentials(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int32_t fd = ArgFd(info, 0, "peerCredentials", "fd");
  struct ucred cred = {};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    ThrowNativeError(env, errno, "getsockopt(SO_PEERCRED)", "fd " + std::to_string(fd));
  Napi::Object out = Napi::Object::New(env);
  out.Set("pid", Napi::Number::New(env, cred.pid));
  out.Set("uid", Napi::Number::New(env, cred.uid));
  out.Set("gid", Napi::Number::New(env, cred.gid));
  return out;
}

}  // namespace

void InitPeerCred(Napi::Env env, Napi::Object exports) {
  exports.Set("peerCredentials", Napi::Function::New(env, PeerCredentials, "peerCredentials"));
}

}  // namespace meshcap
