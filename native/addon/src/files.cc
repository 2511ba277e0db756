// readDirTexts(dir, suffix): every entry of dir whose name ends in suffix,
// read whole, in one call. The agent's state directory holds one small JSON
// record per attachment; at 10,000 pods Node's readFileSync took ~10 us per
// record (a path walk from / for the open, an fstat, the read, the close,
// and the binding's trips) where openat on the directory, one read and the
// close take ~3.5 us. `meshcap status` and the agent's cold start read every
// record (docs/bench-scale.md, round 8).
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"

namespace meshcap {

namespace {

// A record is a few hundred bytes; anything this large is not one, and is
// reported rather than read into memory.
constexpr size_t kMaxFile = 1 << 20;

struct FileText {
  std::string name;
  std::string text;
  int err = 0;             // errno of the failed call (0: read)
  const char* syscall = "";
};

void ReadOne(int dfd, FileText& f) {
  int fd = openat(dfd, f.name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    f.err = errno;
    f.syscall = "open";
    return;
  }
  char buf[16384];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      f.err = errno;
      f.syscall = "read";
      break;
    }
    if (n == 0) break;
    if (f.text.size() + static_cast<size_t>(n) > kMaxFile) {
      f.err = EFBIG;
      f.syscall = "read";
      break;
    }
    f.text.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  if (f.err) f.text.clear();
}

// Returns [{ name, text }] for the files read and [{ name, error }] for the
// others (error: "<syscall>: <errno name> (<text>)"), in directory order.
// A missing or unreadable directory throws a NativeError (code ENOENT, ...).
Napi::Value ReadDirTexts(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string dir = ArgString(info, 0, "readDirTexts", "dir");
  std::string suffix = ArgString(info, 1, "readDirTexts", "suffix");
  DIR* d = opendir(dir.c_str());
  if (!d) ThrowNativeError(env, errno, "opendir", dir);
  std::vector<FileText> files;
  int dfd = dirfd(d);
  errno = 0;
  while (struct dirent* e = readdir(d)) {
    size_t len = strlen(e->d_name);
    if (len < suffix.size() || suffix.compare(0, suffix.size(), e->d_name + len - suffix.size()) != 0) continue;
    FileText f;
    f.name.assign(e->d_name, len);
    ReadOne(dfd, f);
    files.push_back(std::move(f));
    errno = 0;
  }
  int err = errno;
  closedir(d);
  if (err) ThrowNativeError(env, err, "readdir", dir);
  Napi::Array out = Napi::Array::New(env, files.size());
  for (size_t i = 0; i < files.size(); i++) {
    Napi::Object o = Napi::Object::New(env);
    o.Set("name", Napi::String::New(env, files[i].name));
    if (files[i].err) {
      o.Set("error", Napi::String::New(env, std::string(files[i].syscall) + ": " + ErrnoName(files[i].err) + " (" +
                                                ErrnoText(files[i].err) + ")"));
    } else {
      // UTF-8 decoded as readFileSync(file, 'utf8') does (invalid bytes become U+FFFD)
      o.Set("text", Napi::String::New(env, files[i].text));
    }
    out.Set(i, o);
  }
  return out;
}

}  // namespace

void InitFiles(Napi::Env env, Napi::Object exports) {
  exports.Set("readDirTexts", Napi::Function::New(env, ReadDirTexts, "readDirTexts"));
}

}  // namespace meshcap
