// bpf_link lifecycle: create on a cgroup or netns, update in place, detach;
// plus the fd/pin plumbing (objPin, objGet, closeFd).
#include <bpf/bpf.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "common.h"

namespace meshcap {

namespace {

// Opens the attach target (cgroup directory or netns file) read-only.
int OpenTarget(Napi::Env env, const std::string& path, bool directory) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) ThrowNativeError(env, errno, "open", path);
  return fd;
}

Napi::Value LinkCreate(const Napi::CallbackInfo& info, const char* fn, bool cgroup) {
  Napi::Env env = info.Env();
  int progFd = ArgFd(info, 0, fn, "progFd");
  std::string target = ArgString(info, 1, fn, cgroup ? "cgroupPath" : "netnsPath");
  uint32_t attachType = ArgU32(info, 2, fn, "attachType");
  int targetFd = OpenTarget(env, target, cgroup);
  int link = bpf_link_create(progFd, targetFd, static_cast<bpf_attach_type>(attachType), nullptr);
  int err = link < 0 ? ErrOf(link) : 0;
  close(targetFd);
  if (link < 0) ThrowNativeError(env, err, "bpf_link_create", target);
  return Napi::Number::New(env, link);
}

Napi::Value LinkCreateCgroup(const Napi::CallbackInfo& info) {
  return LinkCreate(info, "linkCreateCgroup", true);
}

Napi::Value LinkCreateNetns(const Napi::CallbackInfo& info) {
  return LinkCreate(info, "linkCreateNetns", false);
}

void LinkUpdate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int linkFd = ArgFd(info, 0, "linkUpdate", "linkFd");
  int newProg = ArgFd(info, 1, "linkUpdate", "newProgFd");
  LIBBPF_OPTS(bpf_link_update_opts, opts);
  if (ArgPresent(info, 2)) {
    opts.old_prog_fd = static_cast<__u32>(ArgFd(info, 2, "linkUpdate", "oldProgFd"));
    opts.flags = BPF_F_REPLACE;
  }
  int r = bpf_link_update(linkFd, newProg, &opts);
  if (r < 0) ThrowNativeError(env, ErrOf(r), "bpf_link_update", "link fd " + std::to_string(linkFd));
}

void LinkDetach(const Napi::CallbackInfo& info) {
  int linkFd = ArgFd(info, 0, "linkDetach", "linkFd");
  int r = bpf_link_detach(linkFd);
  if (r < 0)
    ThrowNativeError(info.Env(), ErrOf(r), "bpf_link_detach", "link fd " + std::to_string(linkFd));
}

// Program-to-map attachment (sk_msg verdict on a sockhash): no bpf_link on
// the kernels we support, the map itself holds the program. Attaching again
// swaps the program atomically.
void ProgAttach(const Napi::CallbackInfo& info) {
  int progFd = ArgFd(info, 0, "progAttach", "progFd");
  int targetFd = ArgFd(info, 1, "progAttach", "targetFd");
  uint32_t attachType = ArgU32(info, 2, "progAttach", "attachType");
  int r = bpf_prog_attach(progFd, targetFd, static_cast<bpf_attach_type>(attachType), 0);
  if (r < 0) ThrowNativeError(info.Env(), ErrOf(r), "bpf_prog_attach", "target fd " + std::to_string(targetFd));
}

void ProgDetach(const Napi::CallbackInfo& info) {
  int progFd = ArgFd(info, 0, "progDetach", "progFd");
  int targetFd = ArgFd(info, 1, "progDetach", "targetFd");
  uint32_t attachType = ArgU32(info, 2, "progDetach", "attachType");
  int r = bpf_prog_detach2(progFd, targetFd, static_cast<bpf_attach_type>(attachType));
  if (r < 0) ThrowNativeError(info.Env(), ErrOf(r), "bpf_prog_detach2", "target fd " + std::to_string(targetFd));
}

void ObjPin(const Napi::CallbackInfo& info) {
  int fd = ArgFd(info, 0, "objPin", "fd");
  std::string path = ArgString(info, 1, "objPin", "path");
  int r = bpf_obj_pin(fd, path.c_str());
  if (r < 0) ThrowNativeError(info.Env(), ErrOf(r), "bpf_obj_pin", path);
}

Napi::Value ObjGet(const Napi::CallbackInfo& info) {
  std::string path = ArgString(info, 0, "objGet", "path");
  int fd = bpf_obj_get(path.c_str());
  if (fd < 0) ThrowNativeError(info.Env(), ErrOf(fd), "bpf_obj_get", path);
  return Napi::Number::New(info.Env(), fd);
}

void CloseFd(const Napi::CallbackInfo& info) {
  int fd = ArgFd(info, 0, "closeFd", "fd");
  // Refuse stdio: closing 0-2 by mistake would redirect later output anywhere.
  if (fd <= 2) ThrowType(info.Env(), "closeFd: refusing to close stdio fd " + std::to_string(fd));
  if (close(fd) < 0) ThrowNativeError(info.Env(), errno, "close", "fd " + std::to_string(fd));
}

}  // namespace

void InitLinks(Napi::Env env, Napi::Object exports) {
  exports.Set("linkCreateCgroup", Napi::Function::New(env, LinkCreateCgroup, "linkCreateCgroup"));
  exports.Set("linkCreateNetns", Napi::Function::New(env, LinkCreateNetns, "linkCreateNetns"));
  exports.Set("linkUpdate", Napi::Function::New(env, LinkUpdate, "linkUpdate"));
  exports.Set("linkDetach", Napi::Function::New(env, LinkDetach, "linkDetach"));
  exports.Set("progAttach", Napi::Function::New(env, ProgAttach, "progAttach"));
  exports.Set("progDetach", Napi::Function::New(env, ProgDetach, "progDetach"));
  exports.Set("objPin", Napi::Function::New(env, ObjPin, "objPin"));
  exports.Set("objGet", Napi::Function::New(env, ObjGet, "objGet"));
  exports.Set("closeFd", Napi::Function::New(env, CloseFd, "closeFd"));
}

}  // namespace meshcap
