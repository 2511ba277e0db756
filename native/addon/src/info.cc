// bpf_obj_get_info_by_fd for links, programs and maps.
#include <bpf/bpf.h>
#include <linux/bpf.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"

namespace meshcap {

namespace {

template <typename T>
void GetInfo(Napi::Env env, int fd, T* out, const char* what) {
  *out = T{};
  __u32 len = sizeof(T);
  int r = bpf_obj_get_info_by_fd(fd, out, &len);
  if (r < 0)
    ThrowNativeError(env, ErrOf(r), "bpf_obj_get_info_by_fd", std::string(what) + " fd " + std::to_string(fd));
}

Napi::Value LinkInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0, "linkInfo", "fd");
  RequireBpfFd(env, fd, "bpf-link", "linkInfo");
  bpf_link_info li;
  GetInfo(env, fd, &li, "link");
  Napi::Object o = Napi::Object::New(env);
  o.Set("id", Napi::Number::New(env, li.id));
  o.Set("progId", Napi::Number::New(env, li.prog_id));
  o.Set("type", Napi::Number::New(env, li.type));
  Napi::Value attach = env.Null(), cgroupId = env.Null(), netnsIno = env.Null();
  if (li.type == BPF_LINK_TYPE_CGROUP) {
    attach = Napi::Number::New(env, li.cgroup.attach_type);
    cgroupId = Napi::BigInt::New(env, static_cast<uint64_t>(li.cgroup.cgroup_id));
  } else if (li.type == BPF_LINK_TYPE_NETNS) {
    attach = Napi::Number::New(env, li.netns.attach_type);
    netnsIno = Napi::Number::New(env, li.netns.netns_ino);
  }
  o.Set("attachType", attach);
  o.Set("cgroupId", cgroupId);
  o.Set("netnsIno", netnsIno);
  return o;
}

Napi::Value ProgInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0, "progInfo", "fd");
  RequireBpfFd(env, fd, "bpf-prog", "progInfo");
  bpf_prog_info pi;
  GetInfo(env, fd, &pi, "program");
  char tag[2 * BPF_TAG_SIZE + 1];
  for (int i = 0; i < BPF_TAG_SIZE; i++) snprintf(tag + 2 * i, 3, "%02x", pi.tag[i]);
  Napi::Object o = Napi::Object::New(env);
  o.Set("id", Napi::Number::New(env, pi.id));
  o.Set("name", Napi::String::New(env, std::string(pi.name, strnlen(pi.name, sizeof(pi.name)))));
  o.Set("type", Napi::Number::New(env, pi.type));
  o.Set("tag", Napi::String::New(env, tag));
  return o;
}

Napi::Value MapInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0, "mapInfo", "fd");
  RequireBpfFd(env, fd, "bpf-map", "mapInfo");
  bpf_map_info mi;
  GetInfo(env, fd, &mi, "map");
  Napi::Object o = Napi::Object::New(env);
  o.Set("id", Napi::Number::New(env, mi.id));
  o.Set("name", Napi::String::New(env, std::string(mi.name, strnlen(mi.name, sizeof(mi.name)))));
  o.Set("type", Napi::Number::New(env, mi.type));
  o.Set("keySize", Napi::Number::New(env, mi.key_size));
  o.Set("valueSize", Napi::Number::New(env, mi.value_size));
  o.Set("maxEntries", Napi::Number::New(env, mi.max_entries));
  o.Set("flags", Napi::Number::New(env, mi.map_flags));
  return o;
}

// cgroupPrograms(cgroupPath, attachType) -> [{ id, name }] in the order the
// kernel runs them (BPF_PROG_QUERY on the cgroup, effective = false: what is
// attached to this cgroup itself), for the loader's order check.
Napi::Value CgroupPrograms(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = ArgString(info, 0, "cgroupPrograms", "cgroupPath");
  uint32_t type = ArgU32(info, 1, "cgroupPrograms", "attachType");
  int cg = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (cg < 0) ThrowNativeError(env, errno, "open", path);
  std::vector<__u32> ids(64);
  __u32 cnt = static_cast<__u32>(ids.size());
  __u32 flags = 0;
  int r = bpf_prog_query(cg, static_cast<enum bpf_attach_type>(type), 0, &flags, ids.data(), &cnt);
  if (r < 0 && ErrOf(r) == ENOSPC) {
    ids.resize(cnt);
    r = bpf_prog_query(cg, static_cast<enum bpf_attach_type>(type), 0, &flags, ids.data(), &cnt);
  }
  int err = r < 0 ? ErrOf(r) : 0;
  close(cg);
  if (err) ThrowNativeError(env, err, "bpf_prog_query", path + " attach type " + std::to_string(type));
  Napi::Array out = Napi::Array::New(env, cnt);
  for (__u32 i = 0; i < cnt; i++) {
    Napi::Object o = Napi::Object::New(env);
    o.Set("id", Napi::Number::New(env, ids[i]));
    std::string name;
    int fd = bpf_prog_get_fd_by_id(ids[i]);
    if (fd >= 0) {
      bpf_prog_info pi{};
      __u32 len = sizeof(pi);
      if (bpf_obj_get_info_by_fd(fd, &pi, &len) == 0) name.assign(pi.name, strnlen(pi.name, sizeof(pi.name)));
      close(fd);
    }
    o.Set("name", Napi::String::New(env, name));  // "" when the program went away meanwhile
    out.Set(i, o);
  }
  return out;
}

// Does the link pinned at `pin` live in the netns `netnsPath` names now
// (src/pod-datapath/ebpf-inbound.ts linkProvesNetns)? Anything that does not
// prove it is false. No N-API: the async form runs it on a libuv worker.
bool LinkProvesNetns(const std::string& pin, const std::string& netnsPath, const struct stat& nsfs) {
  int fd = bpf_obj_get(pin.c_str());
  if (fd < 0) return false;
  bool proven = false;
  // a pinned program or map has other info: only a link's says netns
  char link[64], target[64];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  ssize_t len = readlink(link, target, sizeof(target) - 1);
  std::string kind = len > 0 ? std::string(target, static_cast<size_t>(len)) : "";
  bpf_link_info li{};
  __u32 ilen = sizeof(li);
  if ((kind == "anon_inode:bpf-link" || kind == "anon_inode:bpf_link") &&
      bpf_obj_get_info_by_fd(fd, &li, &ilen) == 0 && li.type == BPF_LINK_TYPE_NETNS && li.netns.netns_ino != 0) {
    struct stat st {};
    proven = stat(netnsPath.c_str(), &st) == 0 && st.st_ino == li.netns.netns_ino && st.st_dev == nsfs.st_dev;
  }
  close(fd);
  return proven;
}

std::vector<bool> ProveAll(const std::vector<std::string>& pins, const std::vector<std::string>& paths) {
  std::vector<bool> out(pins.size(), false);
  struct stat nsfs {};
  if (stat("/proc/self/ns/net", &nsfs) != 0) return out;
  for (size_t i = 0; i < pins.size(); i++) out[i] = LinkProvesNetns(pins[i], paths[i], nsfs);
  return out;
}

// (pins, netnsPaths) as two vectors of strings, checked.
void ProofArgs(const Napi::CallbackInfo& info, const char* fn, std::vector<std::string>* pins,
               std::vector<std::string>* paths) {
  Napi::Env env = info.Env();
  const std::string name(fn);
  if (info.Length() < 2 || !info[0].IsArray() || !info[1].IsArray())
    ThrowType(env, name + ": pins and netnsPaths must be arrays of strings");
  Napi::Array p = info[0].As<Napi::Array>(), n = info[1].As<Napi::Array>();
  if (p.Length() != n.Length())
    ThrowType(env, name + ": " + std::to_string(p.Length()) + " pins but " + std::to_string(n.Length()) +
                       " netns paths");
  pins->reserve(p.Length());
  paths->reserve(n.Length());
  for (uint32_t i = 0; i < p.Length(); i++) {
    Napi::Value a = p.Get(i), b = n.Get(i);
    if (!a.IsString() || !b.IsString())
      ThrowType(env, name + ": pins[" + std::to_string(i) + "] and netnsPaths[" + std::to_string(i) +
                         "] must be strings");
    pins->push_back(a.As<Napi::String>().Utf8Value());
    paths->push_back(b.As<Napi::String>().Utf8Value());
  }
}

Napi::Array ProofArray(Napi::Env env, const std::vector<bool>& proven) {
  Napi::Array out = Napi::Array::New(env, proven.size());
  for (size_t i = 0; i < proven.size(); i++) out.Set(static_cast<uint32_t>(i), Napi::Boolean::New(env, proven[i]));
  return out;
}

// For each (pin, netns path) pair, LinkProvesNetns: a pass over every pod in
// one call (the per-pod cost is the syscalls, not four round trips through N-API).
Napi::Value LinksProveNetns(const Napi::CallbackInfo& info) {
  std::vector<std::string> pins, paths;
  ProofArgs(info, "linksProveNetns", &pins, &paths);
  return ProofArray(info.Env(), ProveAll(pins, paths));
}

// The same on a libuv worker (a promise): `meshcap status` compares 10,000
// pods' map entries on the JS thread meanwhile (~15 us of syscalls per pod).
class ProveWorker : public Napi::AsyncWorker {
 public:
  ProveWorker(Napi::Env env, std::vector<std::string> pins, std::vector<std::string> paths)
      : Napi::AsyncWorker(env, "meshcap:links_prove_netns"),
        pins_(std::move(pins)),
        paths_(std::move(paths)),
        deferred_(Napi::Promise::Deferred::New(env)) {}
  Napi::Promise Promise() { return deferred_.Promise(); }
  void Execute() override { proven_ = ProveAll(pins_, paths_); }
  void OnOK() override {
    Napi::HandleScope scope(Env());
    deferred_.Resolve(ProofArray(Env(), proven_));
  }
  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

 private:
  std::vector<std::string> pins_, paths_;
  std::vector<bool> proven_;
  Napi::Promise::Deferred deferred_;
};

Napi::Value LinksProveNetnsAsync(const Napi::CallbackInfo& info) {
  std::vector<std::string> pins, paths;
  ProofArgs(info, "linksProveNetnsAsync", &pins, &paths);
  auto* w = new ProveWorker(info.Env(), std::move(pins), std::move(paths));
  Napi::Promise p = w->Promise();
  w->Queue();  // the worker deletes itself when done
  return p;
}

}  // namespace

void InitInfo(Napi::Env env, Napi::Object exports) {
  exports.Set("linksProveNetns", Napi::Function::New(env, LinksProveNetns, "linksProveNetns"));
  exports.Set("linksProveNetnsAsync", Napi::Function::New(env, LinksProveNetnsAsync, "linksProveNetnsAsync"));
  exports.Set("cgroupPrograms", Napi::Function::New(env, CgroupPrograms, "cgroupPrograms"));
  exports.Set("linkInfo", Napi::Function::New(env, LinkInfo, "linkInfo"));
  exports.Set("progInfo", Napi::Function::New(env, ProgInfo, "progInfo"));
  exports.Set("mapInfo", Napi::Function::New(env, MapInfo, "mapInfo"));
}

}  // namespace meshcap
