// Feature probes: libbpf's for program/map types and helpers, and a trial
// load+link where libbpf has none (attach types on a real target).
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common.h"

namespace meshcap {

namespace {

// libbpf's probes answer "no" for any failed trial load, EPERM included, so
// an unprivileged caller would read "kernel lacks everything" and silently
// fall back. Refuse to probe without CAP_BPF or CAP_SYS_ADMIN instead.
void RequireBpfCapability(Napi::Env env, const char* fn) {
  FILE* f = fopen("/proc/self/status", "re");
  unsigned long long eff = 0;
  bool found = false;
  if (f) {
    char line[256];
    while (fgets(line, sizeof(line), f))
      if (sscanf(line, "CapEff: %llx", &eff) == 1) {
        found = true;
        break;
      }
    fclose(f);
  }
  const unsigned long long capSysAdmin = 1ull << 21, capBpf = 1ull << 39;
  if (found && !(eff & (capSysAdmin | capBpf)))
    ThrowNativeError(env, EPERM, fn, "(process has neither CAP_BPF nor CAP_SYS_ADMIN, probe results would all read 'unsupported')");
}

// libbpf probes answer 1 (yes), 0 (no) or <0. EOPNOTSUPP/EINVAL mean libbpf or
// the kernel does not know the type: "no". Anything else (EPERM, ...) means
// the probe itself could not run, which must not be mistaken for "no".
Napi::Value ProbeResult(Napi::Env env, int r, const char* fn, const std::string& what) {
  if (r >= 0) return Napi::Boolean::New(env, r == 1);
  int err = ErrOf(r);
  if (err == EOPNOTSUPP || err == EINVAL || err == 524 /* ENOTSUPP */)
    return Napi::Boolean::New(env, false);
  ThrowNativeError(env, err, fn, what);
}

Napi::Value ProbeProgType(const Napi::CallbackInfo& info) {
  uint32_t t = ArgU32(info, 0, "probeProgType", "progType");
  RequireBpfCapability(info.Env(), "probeProgType");
  int r;
  {
    // libbpf reads any refused trial load as "no": a pending signal's EAGAIN included (common.h)
    SignalsHeld held;
    r = libbpf_probe_bpf_prog_type(static_cast<bpf_prog_type>(t), nullptr);
  }
  return ProbeResult(info.Env(), r, "libbpf_probe_bpf_prog_type", "prog type " + std::to_string(t));
}

Napi::Value ProbeMapType(const Napi::CallbackInfo& info) {
  uint32_t t = ArgU32(info, 0, "probeMapType", "mapType");
  RequireBpfCapability(info.Env(), "probeMapType");
  int r = libbpf_probe_bpf_map_type(static_cast<bpf_map_type>(t), nullptr);
  // libbpf answers 0 ("absent") for any refusal, EPERM included. A kernel
  // may refuse a sockmap/sockhash to a process without CAP_NET_ADMIN even
  // with CAP_SYS_ADMIN (Debian's 6.1 does, 6.12 does not): ask it directly,
  // so that the answer is "not permitted", not "your kernel is too old".
  if (r == 0 && (t == BPF_MAP_TYPE_SOCKMAP || t == BPF_MAP_TYPE_SOCKHASH)) {
    int fd = bpf_map_create(static_cast<bpf_map_type>(t), nullptr, 4, 4, 1, nullptr);
    if (fd >= 0) {
      close(fd);
      return Napi::Boolean::New(info.Env(), true);
    }
    int err = ErrOf(fd);
    if (err == EPERM || err == EACCES)
      ThrowNativeError(info.Env(), err, "bpf_map_create",
                       std::string(t == BPF_MAP_TYPE_SOCKMAP ? "a sockmap" : "a sockhash") + " (this kernel lets only CAP_NET_ADMIN create one)");
  }
  return ProbeResult(info.Env(), r, "libbpf_probe_bpf_map_type", "map type " + std::to_string(t));
}

// libbpf 1.1's libbpf_probe_bpf_helper only recognises the verifier's older
// "invalid func"/"unknown func" wording; newer kernels say "program of this
// type cannot use helper", so libbpf answers "yes" to every helper. Probe by
// trial load instead: `call helper; r0 = 1; exit`. The verifier resolves the
// helper before it checks the arguments, so any other failure means the
// helper exists for this program type.
uint32_t ProbeAttachTypeFor(uint32_t progType) {
  switch (progType) {
    case BPF_PROG_TYPE_CGROUP_SOCK_ADDR: return BPF_CGROUP_INET4_CONNECT;
    case BPF_PROG_TYPE_CGROUP_SOCKOPT: return BPF_CGROUP_GETSOCKOPT;
    case BPF_PROG_TYPE_CGROUP_SOCK: return BPF_CGROUP_INET_SOCK_CREATE;
    case BPF_PROG_TYPE_SK_LOOKUP: return BPF_SK_LOOKUP;
    case BPF_PROG_TYPE_SOCK_OPS: return BPF_CGROUP_SOCK_OPS;
    case BPF_PROG_TYPE_SK_MSG: return BPF_SK_MSG_VERDICT;
    default: return 0;
  }
}

Napi::Value ProbeHelper(const Napi::CallbackInfo& info) {
  uint32_t t = ArgU32(info, 0, "probeHelper", "progType");
  uint32_t h = ArgU32(info, 1, "probeHelper", "helperId");
  RequireBpfCapability(info.Env(), "probeHelper");
  struct bpf_insn insns[] = {
      {BPF_JMP | BPF_CALL, 0, 0, 0, static_cast<int32_t>(h)},
      {BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 1},
      {BPF_JMP | BPF_EXIT, 0, 0, 0, 0},
  };
  static thread_local char log[8192];
  log[0] = 0;
  LIBBPF_OPTS(bpf_prog_load_opts, opts, .expected_attach_type = static_cast<bpf_attach_type>(ProbeAttachTypeFor(t)),
              .log_level = 1, .log_size = sizeof(log), .log_buf = log);
  int fd;
  {
    // a probe the verifier gave up on for a pending signal would read as a
    // missing feature, and send the node to iptables mode (common.h)
    SignalsHeld held;
    fd = bpf_prog_load(static_cast<bpf_prog_type>(t), nullptr, "GPL", insns, 3, &opts);
  }
  if (fd >= 0) {
    close(fd);
    return Napi::Boolean::New(info.Env(), true);
  }
  int err = errno;
  if (strstr(log, "cannot use helper") || strstr(log, "unknown func") || strstr(log, "invalid func"))
    return Napi::Boolean::New(info.Env(), false);
  if (log[0] != 0) return Napi::Boolean::New(info.Env(), true);  // refused for its arguments: helper exists
  if (err == EINVAL || err == EOPNOTSUPP || err == 524 /* ENOTSUPP */)
    return Napi::Boolean::New(info.Env(), false);  // program type itself unknown
  ThrowNativeError(info.Env(), err, "bpf_prog_load", "helper " + std::to_string(h) + " in prog type " + std::to_string(t));
}

// probeAttach(progType, expectedAttachType, targetPath): load `r0 = 1; exit`
// with that type and link it to the target (cgroup dir or netns file), then
// drop both. The program allows everything, so the instant it is attached
// changes no traffic.
Napi::Value ProbeAttach(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t progType = ArgU32(info, 0, "probeAttach", "progType");
  uint32_t attachType = ArgU32(info, 1, "probeAttach", "expectedAttachType");
  std::string target = ArgString(info, 2, "probeAttach", "targetPath");

  int targetFd = open(target.c_str(), O_RDONLY | O_CLOEXEC);
  if (targetFd < 0) ThrowNativeError(env, errno, "open", target);

  const bpf_insn insns[] = {
      {BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 1},  // r0 = 1
      {BPF_JMP | BPF_EXIT, 0, 0, 0, 0},                   // exit
  };
  LIBBPF_OPTS(bpf_prog_load_opts, opts, .expected_attach_type = static_cast<bpf_attach_type>(attachType));
  int progFd;
  {
    SignalsHeld held;  // as in probeHelper
    progFd = bpf_prog_load(static_cast<bpf_prog_type>(progType), "meshcap_probe", "GPL", insns,
                           sizeof(insns) / sizeof(insns[0]), &opts);
  }
  const char* stage = "bpf_prog_load";
  int err = 0;
  if (progFd < 0) {
    err = ErrOf(progFd);
  } else {
    stage = "bpf_link_create";
    int link = bpf_link_create(progFd, targetFd, static_cast<bpf_attach_type>(attachType), nullptr);
    if (link < 0) err = ErrOf(link);
    else close(link);
    close(progFd);
  }
  close(targetFd);

  Napi::Object out = Napi::Object::New(env);
  out.Set("ok", Napi::Boolean::New(env, err == 0));
  if (err) {
    out.Set("code", Napi::String::New(env, ErrnoName(err)));
    out.Set("errno", Napi::Number::New(env, err));
    out.Set("syscall", Napi::String::New(env, stage));
  }
  return out;
}

}  // namespace

void InitProbes(Napi::Env env, Napi::Object exports) {
  exports.Set("probeProgType", Napi::Function::New(env, ProbeProgType, "probeProgType"));
  exports.Set("probeMapType", Napi::Function::New(env, ProbeMapType, "probeMapType"));
  exports.Set("probeHelper", Napi::Function::New(env, ProbeHelper, "probeHelper"));
  exports.Set("probeAttach", Napi::Function::New(env, ProbeAttach, "probeAttach"));
}

}  // namespace meshcap
