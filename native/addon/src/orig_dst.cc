// getOriginalDst(fd, 'ipv4' | 'ipv6'): what a proxy asks after accepting a
// redirected connection (SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST), with the
// same 128-byte buffer Envoy passes, so the reference proxy sees exactly what
// Envoy would.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "common.h"

namespace meshcap {

namespace {

constexpr int kSoOriginalDst = 80;  // SO_ORIGINAL_DST == IP6T_SO_ORIGINAL_DST

Napi::Value GetOriginalDst(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0, "getOriginalDst", "fd");
  std::string level = ArgString(info, 1, "getOriginalDst", "level");
  bool v6;
  if (level == "ipv4") v6 = false;
  else if (level == "ipv6") v6 = true;
  else ThrowType(env, "getOriginalDst: level must be 'ipv4' or 'ipv6', got '" + level + "'");

  uint8_t buf[128];
  std::memset(buf, 0, sizeof(buf));
  socklen_t len = sizeof(buf);
  if (getsockopt(fd, v6 ? SOL_IPV6 : SOL_IP, kSoOriginalDst, buf, &len) < 0)
    ThrowNativeError(env, errno, v6 ? "getsockopt(SOL_IPV6, IP6T_SO_ORIGINAL_DST)"
                                    : "getsockopt(SOL_IP, SO_ORIGINAL_DST)",
                     "fd " + std::to_string(fd));

  char addr[INET6_ADDRSTRLEN] = "";
  int port = 0, family = 0;
  sa_family_t fam;
  std::memcpy(&fam, buf, sizeof(fam));
  if (fam == AF_INET && len >= sizeof(sockaddr_in)) {
    sockaddr_in sin;
    std::memcpy(&sin, buf, sizeof(sin));
    inet_ntop(AF_INET, &sin.sin_addr, addr, sizeof(addr));
    port = ntohs(sin.sin_port);
    family = 4;
  } else if (fam == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    sockaddr_in6 sin6;
    std::memcpy(&sin6, buf, sizeof(sin6));
    inet_ntop(AF_INET6, &sin6.sin6_addr, addr, sizeof(addr));
    port = ntohs(sin6.sin6_port);
    family = 6;
  } else {
    // The kernel answered but not with a sockaddr we know: report, not guess.
    ThrowNativeError(env, EAFNOSUPPORT, "getsockopt(SO_ORIGINAL_DST)",
                     "fd " + std::to_string(fd) + " (family " + std::to_string(fam) + ", optlen " +
                         std::to_string(len) + ")");
  }
  Napi::Object out = Napi::Object::New(env);
  out.Set("family", Napi::Number::New(env, family));
  out.Set("address", Napi::String::New(env, addr));
  out.Set("port", Napi::Number::New(env, port));
  out.Set("raw", Napi::Buffer<uint8_t>::Copy(env, buf, len));
  out.Set("optlen", Napi::Number::New(env, len));
  return out;
}

// setTransparent(fd, 'ipv4' | 'ipv6'): IP_TRANSPARENT / IPV6_TRANSPARENT on a
// listening socket, as Envoy sets on its inbound listener in TPROXY mode: the
// TPROXY target only delivers to transparent sockets.
Napi::Value SetTransparent(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0, "setTransparent", "fd");
  std::string level = ArgString(info, 1, "setTransparent", "level");
  if (level != "ipv4" && level != "ipv6")
    ThrowType(env, "setTransparent: level must be 'ipv4' or 'ipv6', got '" + level + "'");
  bool v6 = level == "ipv6";
  int one = 1;
  if (setsockopt(fd, v6 ? SOL_IPV6 : SOL_IP, v6 ? IPV6_TRANSPARENT : IP_TRANSPARENT, &one, sizeof(one)) < 0)
    ThrowNativeError(env, errno, v6 ? "setsockopt(SOL_IPV6, IPV6_TRANSPARENT)" : "setsockopt(SOL_IP, IP_TRANSPARENT)",
                     "fd " + std::to_string(fd));
  return env.Undefined();
}

}  // namespace

void InitOrigDst(Napi::Env env, Napi::Object exports) {
  exports.Set("getOriginalDst", Napi::Function::New(env, GetOriginalDst, "getOriginalDst"));
  exports.Set("setTransparent", Napi::Function::New(env, SetTransparent, "setTransparent"));
}

}  // namespace meshcap
