// Map element operations. Every call first reads the map's key/value sizes
// from the kernel (one cheap syscall) so a wrong-sized Buffer is a TypeError
// instead of the kernel reading or writing past the end of JS memory.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "common.h"

namespace meshcap {

namespace {

constexpr int kENOTSUPP = 524;  // kernel-internal "operation not supported"

struct MapDims {
  uint32_t keySize;
  uint32_t valueSize;  // as seen from userspace (per-CPU maps: one slot per possible CPU)
  uint32_t maxEntries;
  uint32_t type;
};

bool IsPerCpu(uint32_t type) {
  return type == BPF_MAP_TYPE_PERCPU_HASH || type == BPF_MAP_TYPE_PERCPU_ARRAY ||
         type == BPF_MAP_TYPE_LRU_PERCPU_HASH || type == BPF_MAP_TYPE_PERCPU_CGROUP_STORAGE;
}

MapDims Dims(Napi::Env env, int fd, const char* fn) {
  RequireBpfFd(env, fd, "bpf-map", fn);
  bpf_map_info mi{};
  __u32 len = sizeof(mi);
  int r = bpf_obj_get_info_by_fd(fd, &mi, &len);
  if (r < 0) ThrowNativeError(env, ErrOf(r), "bpf_obj_get_info_by_fd", "map fd " + std::to_string(fd));
  MapDims d{mi.key_size, mi.value_size, mi.max_entries, mi.type};
  if (IsPerCpu(mi.type)) {
    int ncpu = libbpf_num_possible_cpus();
    if (ncpu < 0) ThrowNativeError(env, ErrOf(ncpu), "libbpf_num_possible_cpus", "");
    d.valueSize = ((mi.value_size + 7) / 8) * 8 * static_cast<uint32_t>(ncpu);
  }
  return d;
}

std::string MapObj(int fd) { return "map fd " + std::to_string(fd); }

Napi::Buffer<uint8_t> SizedBuffer(const Napi::CallbackInfo& info, size_t i, const char* fn,
                                  const char* name, uint32_t want) {
  Napi::Buffer<uint8_t> b = ArgBuffer(info, i, fn, name);
  if (b.Length() != want)
    ThrowType(info.Env(), std::string(fn) + ": " + name + " is " + std::to_string(b.Length()) +
                              " bytes, the map's " + (std::strstr(name, "key") ? "key" : "value") +
                              " size is " + std::to_string(want));
  return b;
}

uint64_t ArgFlags(const Napi::CallbackInfo& info, size_t i, const char* fn) {
  return ArgPresent(info, i) ? ArgU32(info, i, fn, "flags") : uint64_t{BPF_ANY};
}

const void* KeyPtr(const Napi::Buffer<uint8_t>& b) { return b.Length() ? b.Data() : nullptr; }

void MapUpdate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0, "mapUpdate", "fd");
  MapDims d = Dims(env, fd, "mapUpdate");
  auto key = SizedBuffer(info, 1, "mapUpdate", "key", d.keySize);
  auto value = SizedBuffer(info, 2, "mapUpdate", "value", d.valueSize);
  uint64_t flags = ArgFlags(info, 3, "mapUpdate");
  int r = bpf_map_update_elem(fd, KeyPtr(key), value.Data(), flags);
  if (r < 0) ThrowNativeError(env, ErrOf(r), "bpf_map_update_elem", MapObj(fd));
}

Napi::Value MapLookup(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0, "mapLookup", "fd");
  MapDims d = Dims(env, fd, "mapLookup");
  auto key = SizedBuffer(info, 1, "mapLookup", "key", d.keySize);
  uint32_t valueSize = ArgU32(info, 2, "mapLookup", "valueSize");
  if (valueSize != d.valueSize)
    ThrowType(env, "mapLookup: valueSize is " + std::to_string(valueSize) +
                       ", the map's value size is " + std::to_string(d.valueSize));
  auto out = Napi::Buffer<uint8_t>::New(env, d.valueSize);
  int r = bpf_map_lookup_elem(fd, KeyPtr(key), out.Data());
  if (r < 0) {
    int err = ErrOf(r);
    if (err == ENOENT) return env.Null();
    ThrowNativeError(env, err, "bpf_map_lookup_elem", MapObj(fd));
  }
  return out;
}

Napi::Value MapDelete(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0, "mapDelete", "fd");
  MapDims d = Dims(env, fd, "mapDelete");
  auto key = SizedBuffer(info, 1, "mapDelete", "key", d.keySize);
  int r = bpf_map_delete_elem(fd, KeyPtr(key));
  if (r < 0) {
    int err = ErrOf(r);
    if (err == ENOENT) return Napi::Boolean::New(env, false);
    ThrowNativeError(env, err, "bpf_map_delete_elem", MapObj(fd));
  }
  return Napi::Boolean::New(env, true);
}

// Full walk with get_next_key. If the key we continue from is deleted
// concurrently, the kernel restarts at the first key; the seen-set drops the
// repeats and the step bound keeps a map under heavy churn from looping.
// visit(key) runs once per distinct key.
template <typename Visit>
void WalkKeys(Napi::Env env, int fd, const MapDims& d, Visit visit) {
  std::set<std::string> seen;
  std::string cur(d.keySize, '\0'), next(d.keySize, '\0');
  bool first = true;
  const uint64_t maxSteps = 4ull * (static_cast<uint64_t>(d.maxEntries) + 1) + 64;
  for (uint64_t step = 0;; step++) {
    if (step > maxSteps)
      ThrowNativeError(env, EAGAIN, "bpf_map_get_next_key",
                       MapObj(fd) + " (walk did not finish in " + std::to_string(maxSteps) +
                           " steps: map changing too fast)");
    int r = bpf_map_get_next_key(fd, first ? nullptr : cur.data(), next.data());
    if (r < 0) {
      int err = ErrOf(r);
      if (err == ENOENT) return;
      ThrowNativeError(env, err, "bpf_map_get_next_key", MapObj(fd));
    }
    first = false;
    cur.swap(next);
    if (seen.insert(cur).second) visit(cur);
  }
}

// A key walk's fd and dims, its keySize argument checked against the map's.
struct KeyWalk {
  int fd;
  MapDims d;
};
KeyWalk KeyWalkArgs(const Napi::CallbackInfo& info, const char* fn) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0, fn, "fd");
  MapDims d = Dims(env, fd, fn);
  uint32_t keySize = ArgU32(info, 1, fn, "keySize");
  if (keySize != d.keySize)
    ThrowType(env, std::string(fn) + ": keySize is " + std::to_string(keySize) + ", the map's key size is " +
                       std::to_string(d.keySize));
  return {fd, d};
}

Napi::Value MapKeys(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  KeyWalk w = KeyWalkArgs(info, "mapKeys");
  if (w.d.keySize == 0) return Napi::Array::New(env);  // queue/stack: no keys to walk
  std::vector<std::string> keys;
  WalkKeys(env, w.fd, w.d, [&](const std::string& k) { keys.push_back(k); });
  Napi::Array out = Napi::Array::New(env, keys.size());
  for (uint32_t i = 0; i < keys.size(); i++)
    out.Set(i, Napi::Buffer<uint8_t>::Copy(env, reinterpret_cast<const uint8_t*>(keys[i].data()),
                                           keys[i].size()));
  return out;
}

// Every key of a map in one Buffer, end to end (the walk mapKeys makes): a
// pass reads mc_listen, a SOCKHASH without batch lookup, whose keys at
// 10,000 pods with proxies are tens of thousands; a Buffer each was ~240 B of
// heap per key, all alive until the walk's array was dropped.
Napi::Value MapKeysPacked(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  KeyWalk w = KeyWalkArgs(info, "mapKeysPacked");
  std::string keys;
  if (w.d.keySize > 0) WalkKeys(env, w.fd, w.d, [&](const std::string& k) { keys.append(k); });
  return Napi::Buffer<uint8_t>::Copy(env, reinterpret_cast<const uint8_t*>(keys.data()), keys.size());
}

// Concatenates an array of equally sized Buffers.
std::vector<uint8_t> Pack(const Napi::CallbackInfo& info, size_t i, const char* fn,
                          const char* name, uint32_t size, uint32_t* count) {
  Napi::Env env = info.Env();
  if (i >= info.Length() || !info[i].IsArray())
    ThrowType(env, std::string(fn) + ": " + name + " must be an array of Buffers");
  Napi::Array a = info[i].As<Napi::Array>();
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(a.Length()) * size);
  for (uint32_t k = 0; k < a.Length(); k++) {
    Napi::Value v = a.Get(k);
    std::string where = std::string(name) + "[" + std::to_string(k) + "]";
    if (!v.IsBuffer()) ThrowType(env, std::string(fn) + ": " + where + " must be a Buffer");
    auto b = v.As<Napi::Buffer<uint8_t>>();
    if (b.Length() != size)
      ThrowType(env, std::string(fn) + ": " + where + " is " + std::to_string(b.Length()) +
                         " bytes, the map's element size is " + std::to_string(size));
    out.insert(out.end(), b.Data(), b.Data() + b.Length());
  }
  *count = a.Length();
  return out;
}

bool NoBatchSupport(int err) { return err == EINVAL || err == kENOTSUPP || err == EOPNOTSUPP; }

// A map type without batch ops fails before the kernel writes `count` back,
// so libbpf hands back the count we passed in (0 on some paths): either way
// nothing was processed.
bool NothingProcessed(uint32_t count, uint32_t asked) { return count == 0 || count == asked; }

// (fd, keys[], values[]) of a write of many entries: the map's fd and size
// checked once, keys and values packed, as many of one as of the other.
struct Entries {
  int fd;
  MapDims d;
  std::vector<uint8_t> keys, values;
  uint32_t n;
};

Entries ArgEntries(const Napi::CallbackInfo& info, const char* fn) {
  Entries e{};
  e.fd = ArgFd(info, 0, fn, "fd");
  e.d = Dims(info.Env(), e.fd, fn);
  uint32_t nv = 0;
  e.keys = Pack(info, 1, fn, "keys", e.d.keySize, &e.n);
  e.values = Pack(info, 2, fn, "values", e.d.valueSize, &nv);
  if (e.n != nv)
    ThrowType(info.Env(), std::string(fn) + ": " + std::to_string(e.n) + " keys but " + std::to_string(nv) + " values");
  return e;
}

void MapUpdateBatch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Entries e = ArgEntries(info, "mapUpdateBatch");
  int fd = e.fd;
  const MapDims& d = e.d;
  const auto& keys = e.keys;
  const auto& values = e.values;
  uint32_t nk = e.n;
  if (nk == 0) return;
  uint32_t count = nk;
  int r = bpf_map_update_batch(fd, keys.data(), values.data(), &count, nullptr);
  if (r == 0) return;
  int err = ErrOf(r);
  if (!(NoBatchSupport(err) && NothingProcessed(count, nk)))
    ThrowNativeError(env, err, "bpf_map_update_batch",
                     MapObj(fd) + " (" + std::to_string(count) + " of " + std::to_string(nk) + " written)");
  // Map type without batch ops (e.g. LPM trie, or kernels < 5.6): one by one.
  for (uint32_t k = 0; k < nk; k++) {
    int e = bpf_map_update_elem(fd, keys.data() + static_cast<size_t>(k) * d.keySize,
                                values.data() + static_cast<size_t>(k) * d.valueSize, BPF_ANY);
    if (e < 0)
      ThrowNativeError(env, ErrOf(e), "bpf_map_update_elem",
                       MapObj(fd) + " (" + std::to_string(k) + " of " + std::to_string(nk) + " written)");
  }
}

// The entries in order, one BPF_MAP_UPDATE_ELEM each, with one size check
// for all of them: a pod's keyed entries cost 3 syscalls each through
// mapUpdate (the fd check's readlink, the map info, the update), 1 here.
// Stops at the first failure and returns how many were written before it,
// so the caller knows exactly what is in the map (mapUpdate of the failing
// entry reports its error); with no failure, returns the count.
Napi::Value MapUpdateEach(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Entries e = ArgEntries(info, "mapUpdateEach");
  int fd = e.fd;
  const MapDims& d = e.d;
  const auto& keys = e.keys;
  const auto& values = e.values;
  uint32_t nk = e.n;
  uint64_t flags = ArgFlags(info, 3, "mapUpdateEach");
  uint32_t k = 0;
  for (; k < nk; k++) {
    if (bpf_map_update_elem(fd, keys.data() + static_cast<size_t>(k) * d.keySize,
                            values.data() + static_cast<size_t>(k) * d.valueSize, flags) < 0)
      break;
  }
  return Napi::Number::New(env, k);
}

Napi::Value MapDeleteBatch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0, "mapDeleteBatch", "fd");
  MapDims d = Dims(env, fd, "mapDeleteBatch");
  uint32_t nk = 0;
  auto keys = Pack(info, 1, "mapDeleteBatch", "keys", d.keySize, &nk);
  uint32_t deleted = 0, pos = 0;
  bool batch = true;
  while (pos < nk) {
    const uint8_t* at = keys.data() + static_cast<size_t>(pos) * d.keySize;
    if (batch) {
      uint32_t count = nk - pos;
      int r = bpf_map_delete_batch(fd, at, &count, nullptr);
      if (r == 0) {
        deleted += count;
        break;
      }
      int err = ErrOf(r);
      if (NoBatchSupport(err) && NothingProcessed(count, nk - pos)) {
        batch = false;
        continue;
      }
      deleted += count;
      pos += count;
      if (err == ENOENT) {  // keys[pos] was absent; the batch stopped there
        pos++;
        continue;
      }
      ThrowNativeError(env, err, "bpf_map_delete_batch", MapObj(fd));
    }
    int r = bpf_map_delete_elem(fd, at);
    if (r == 0) {
      deleted++;
    } else if (ErrOf(r) != ENOENT) {
      ThrowNativeError(env, ErrOf(r), "bpf_map_delete_elem", MapObj(fd));
    }
    pos++;
  }
  return Napi::Number::New(env, deleted);
}

// Every entry of a map, keys and values packed in two Buffers (count of
// each, in the map's sizes). One BPF_MAP_LOOKUP_BATCH per chunk of entries
// instead of a get_next_key + lookup pair per entry: `meshcap status` and the
// reconcile read whole maps of 10,000 pods. Map types or kernels without batch
// ops (LPM trie, < 5.6) and {noBatch: true} (tests) walk keys one by one.
Napi::Value MapEntries(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0, "mapEntries", "fd");
  MapDims d = Dims(env, fd, "mapEntries");
  bool noBatch = false;
  uint32_t chunk = std::min<uint32_t>(std::max<uint32_t>(d.maxEntries, 1), 4096);
  if (ArgPresent(info, 1)) {
    if (!info[1].IsObject()) ThrowType(env, "mapEntries: opts must be an object");
    Napi::Object o = info[1].As<Napi::Object>();
    Napi::Value v = o.Get("noBatch");
    noBatch = v.IsBoolean() && v.As<Napi::Boolean>().Value();
    Napi::Value c = o.Get("chunk");  // entries per batch call (tests: resume and growth)
    if (c.IsNumber()) {
      double x = c.As<Napi::Number>().DoubleValue();
      if (!(x >= 1 && x <= 65536)) ThrowType(env, "mapEntries: opts.chunk must be 1..65536");
      chunk = static_cast<uint32_t>(x);
    }
  }
  const size_t ks = d.keySize, vs = d.valueSize;
  std::vector<uint8_t> keys, values;
  uint32_t n = 0;
  bool batched = false;
  if (ks > 0 && !noBatch) {
    // The resume token: a bucket index (hash maps) or a key (arrays).
    std::vector<uint8_t> inTok(std::max<size_t>(ks, 8)), outTok(inTok.size());
    bool first = true;
    batched = true;
    LIBBPF_OPTS(bpf_map_batch_opts, opts);
    for (;;) {
      keys.resize((static_cast<size_t>(n) + chunk) * ks);
      values.resize((static_cast<size_t>(n) + chunk) * vs);
      uint32_t count = chunk;
      int r = bpf_map_lookup_batch(fd, first ? nullptr : inTok.data(), outTok.data(),
                                   keys.data() + static_cast<size_t>(n) * ks,
                                   values.data() + static_cast<size_t>(n) * vs, &count, &opts);
      if (r == 0) {
        n += count;
        first = false;
        inTok.swap(outTok);
        continue;
      }
      int err = ErrOf(r);
      if (err == ENOENT) {  // the last chunk (count may be 0)
        n += count;
        break;
      }
      if (err == ENOSPC && chunk < (1u << 20)) {  // one hash bucket holds more than chunk entries
        chunk *= 2;
        continue;
      }
      if (first && NoBatchSupport(err)) {
        batched = false;
        n = 0;
        break;
      }
      ThrowNativeError(env, err, "bpf_map_lookup_batch", MapObj(fd));
    }
  }
  if (ks > 0 && !batched) {
    // One by one, as mapKeys walks.
    keys.clear();
    values.clear();
    std::vector<uint8_t> value(vs);
    WalkKeys(env, fd, d, [&](const std::string& k) {
      int l = bpf_map_lookup_elem(fd, k.data(), value.data());
      if (l < 0) {
        if (ErrOf(l) == ENOENT) return;  // deleted since the walk saw it
        ThrowNativeError(env, ErrOf(l), "bpf_map_lookup_elem", MapObj(fd));
      }
      keys.insert(keys.end(), k.begin(), k.end());
      values.insert(values.end(), value.begin(), value.end());
      n++;
    });
  }
  Napi::Object out = Napi::Object::New(env);
  out.Set("count", Napi::Number::New(env, n));
  out.Set("keySize", Napi::Number::New(env, static_cast<double>(ks)));
  out.Set("valueSize", Napi::Number::New(env, static_cast<double>(vs)));
  out.Set("keys", Napi::Buffer<uint8_t>::Copy(env, keys.data(), static_cast<size_t>(n) * ks));
  out.Set("values", Napi::Buffer<uint8_t>::Copy(env, values.data(), static_cast<size_t>(n) * vs));
  out.Set("batched", Napi::Boolean::New(env, batched));
  return out;
}

}  // namespace

void InitMaps(Napi::Env env, Napi::Object exports) {
  exports.Set("mapUpdate", Napi::Function::New(env, MapUpdate, "mapUpdate"));
  exports.Set("mapLookup", Napi::Function::New(env, MapLookup, "mapLookup"));
  exports.Set("mapDelete", Napi::Function::New(env, MapDelete, "mapDelete"));
  exports.Set("mapKeys", Napi::Function::New(env, MapKeys, "mapKeys"));
  exports.Set("mapKeysPacked", Napi::Function::New(env, MapKeysPacked, "mapKeysPacked"));
  exports.Set("mapEntries", Napi::Function::New(env, MapEntries, "mapEntries"));
  exports.Set("mapUpdateBatch", Napi::Function::New(env, MapUpdateBatch, "mapUpdateBatch"));
  exports.Set("mapDeleteBatch", Napi::Function::New(env, MapDeleteBatch, "mapDeleteBatch"));
  exports.Set("mapUpdateEach", Napi::Function::New(env, MapUpdateEach, "mapUpdateEach"));
}

}  // namespace meshcap
