// CniListener: the agent's CNI socket served by a native thread. It accepts
// the forwarder's connections, checks the peer's uid (SO_PEERCRED), reads
// each request to the client's half-close (bounded in size and time), and
// hands JavaScript one event per connection: (id, kind, text, pid, uid, gid,
// ageMs). JavaScript answers with reply(id, text); the thread writes it,
// half-closes, and closes the connection once the client has too.
//
// Why not node's net.Server: every accepted socket there is a JS Socket, a
// Duplex and a native handle wrap. The wrap is a modified API object, which
// V8's scavenger keeps as a root, so each connection's objects reach old
// space although they live ~2 ms, and their native memory (~3.6 KB a
// connection) is freed only at the next major GC. A burst of 10,000 CNI DELs
// put the agent's RSS over its 100 MB budget that way (docs/bench-scale.md).
// Here a connection costs JavaScript two strings and a callback.
#include <fcntl.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common.h"

namespace meshcap {

namespace {

// Event kinds, mirrored in src/native/addon.ts (CniEventKind).
enum Kind : int {
  kRequest = 0,  // the whole request, the client half-closed
  kRefused = 1,  // the peer is not allowed; text says why when its uid is unknown
  kTooBig = 2,   // the request passed maxRequestBytes; further input is dropped
  kTimeout = 3,  // the request was not complete within readTimeoutMs
  kError = 4,    // the listening socket failed (accept): text says how; id 0
};

int64_t NowUs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}
int64_t NowMs() { return NowUs() / 1000; }

struct Shared;

struct Event {
  std::shared_ptr<Shared> sh;
  double id;
  int kind;
  std::string text;
  double pid, uid, gid;
  double ageMs;
};

enum class Phase {
  Reading,    // accumulating the request
  Dropping,   // an event sent that needs no more input (refused, too big, timed out): read and drop
  Waiting,    // the request was delivered and the client half-closed: nothing to poll
  Writing,    // the reply is partly written (EPOLLOUT)
  Lingering,  // reply written and half-closed; waiting for the client's close
};

struct Conn {
  int fd = -1;
  uint64_t id = 0;
  Phase phase = Phase::Reading;
  bool eof = false;            // the client half-closed
  int64_t acceptedUs = 0;
  int64_t deadline = 0;        // ms (monotonic); 0 = none
  uint32_t events = 0;         // what epoll watches now
  std::string in;
  std::string out;
  size_t outOff = 0;
  int pid = 0, uid = -1, gid = -1;
};

constexpr uint64_t kListenTag = 1;
constexpr uint64_t kWakeTag = 2;
constexpr uint64_t kFirstId = 16;

// What the thread and the JS object share. The JS side holds it through a
// shared_ptr, and so does every queued event, so a late event finds it.
struct Shared {
  std::mutex mu;
  std::deque<std::pair<uint64_t, std::string>> replies;
  std::atomic<bool> closed{false};  // close() called: the thread stops, events and replies are dropped
  std::atomic<uint32_t> open{0};
  int wakeFd = -1;
};

class Loop {
 public:
  Loop(int listenFd, std::shared_ptr<Shared> shared, Napi::ThreadSafeFunction tsfn, size_t maxBytes,
       int64_t readTimeoutMs, int64_t allowUid)
      : listenFd_(listenFd), sh_(std::move(shared)), tsfn_(tsfn), maxBytes_(maxBytes),
        timeoutMs_(readTimeoutMs), allowUid_(allowUid) {}

  // Sets up epoll; errno-style failure reported to the caller on the JS thread.
  int Init() {
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    if (ep_ < 0) return errno;
    if (Watch(listenFd_, kListenTag, EPOLLIN) != 0) return errno;
    if (Watch(sh_->wakeFd, kWakeTag, EPOLLIN) != 0) return errno;
    return 0;
  }

  void Run() {
    pthread_setname_np(pthread_self(), "meshcap-cni");
    epoll_event evs[64];
    while (!sh_->closed.load()) {
      int n = epoll_wait(ep_, evs, 64, WaitMs());
      if (n < 0 && errno != EINTR) {
        Emit(0, kError, std::string("epoll_wait: ") + ErrnoName(errno) + "; the CNI socket is no longer served: restart the agent", nullptr);
        break;
      }
      for (int i = 0; i < n; i++) {
        uint64_t tag = evs[i].data.u64;
        if (tag == kListenTag) {
          Accept();
        } else if (tag == kWakeTag) {
          uint64_t v;
          while (read(sh_->wakeFd, &v, sizeof v) > 0) {}
        } else {
          auto it = conns_.find(tag);
          if (it != conns_.end()) OnReady(it->second.get(), evs[i].events);
        }
      }
      TakeReplies();
      Expire();
    }
    // Cut whatever is open: the forwarder sees a close without an answer.
    for (auto& [id, c] : conns_) close(c->fd);
    conns_.clear();
    sh_->open.store(0);
    close(ep_);
  }

 private:
  int Watch(int fd, uint64_t tag, uint32_t events) {
    epoll_event ev = {};
    ev.events = events;
    ev.data.u64 = tag;
    return epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev);
  }

  // Nothing to wait for means out of epoll altogether: epoll reports
  // EPOLLHUP whatever the mask, and a forwarder that dies while its request
  // is with the handler would otherwise wake this thread in a loop.
  void Interest(Conn* c, uint32_t events) {
    if (c->events == events) return;
    epoll_event ev = {};
    ev.events = events;
    ev.data.u64 = c->id;
    int op = events == 0 ? EPOLL_CTL_DEL : c->events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
    epoll_ctl(ep_, op, c->fd, &ev);
    c->events = events;
  }

  int WaitMs() {
    int64_t next = listenPausedUntil_;
    for (auto& [id, c] : conns_)
      if (c->deadline != 0 && (next == 0 || c->deadline < next)) next = c->deadline;
    if (next == 0) return -1;
    int64_t d = next - NowMs();
    return d < 0 ? 0 : static_cast<int>(d > 60000 ? 60000 : d);
  }

  void Emit(uint64_t id, int kind, std::string text, const Conn* c) {
    auto* e = new Event{sh_, static_cast<double>(id), kind, std::move(text),
                        c ? static_cast<double>(c->pid) : 0, c ? static_cast<double>(c->uid) : -1,
                        c ? static_cast<double>(c->gid) : -1,
                        c ? static_cast<double>(NowUs() - c->acceptedUs) / 1000.0 : 0};
    if (tsfn_.NonBlockingCall(e, CallJs) != napi_ok) delete e;
  }

 public:
  static void CallJs(Napi::Env env, Napi::Function cb, Event* e) {
    std::unique_ptr<Event> owned(e);
    // torn down with events queued, or closed: the connection was cut
    if (env == nullptr || cb.IsEmpty() || e->sh->closed.load()) return;
    Napi::HandleScope scope(env);
    try {
      cb.Call({Napi::Number::New(env, e->id), Napi::Number::New(env, e->kind),
               Napi::String::New(env, e->text), Napi::Number::New(env, e->pid),
               Napi::Number::New(env, e->uid), Napi::Number::New(env, e->gid),
               Napi::Number::New(env, e->ageMs)});
    } catch (const Napi::Error& err) {
      // A throw in the handler is the program's bug: node's uncaught path.
      napi_fatal_exception(env, err.Value());
    }
  }

 private:
  void Accept() {
    for (;;) {
      int fd = accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) return;
        int err = errno;
        // EMFILE/ENFILE/ENOBUFS: the pending connection stays queued and
        // epoll would report it again at once; pause accepting for 100 ms.
        epoll_event ev = {};
        epoll_ctl(ep_, EPOLL_CTL_DEL, listenFd_, &ev);
        listenPausedUntil_ = NowMs() + 100;
        Emit(0, kError, std::string("accept4: ") + ErrnoName(err) + " (" + ErrnoText(err) + "); accepting again in 100 ms", nullptr);
        return;
      }
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->id = nextId_++;
      c->acceptedUs = NowUs();
      c->deadline = c->acceptedUs / 1000 + timeoutMs_;
      Conn* p = c.get();
      conns_.emplace(p->id, std::move(c));
      sh_->open.store(static_cast<uint32_t>(conns_.size()));
      p->events = EPOLLIN;
      if (Watch(fd, p->id, EPOLLIN) != 0) {
        Drop(p);
        continue;
      }
      struct ucred cred = {};
      socklen_t len = sizeof cred;
      if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        int err = errno;
        p->phase = Phase::Dropping;
        p->deadline = 0;
        Emit(p->id, kRefused, std::string("getsockopt(SO_PEERCRED): ") + ErrnoName(err), p);
        continue;
      }
      p->pid = cred.pid;
      p->uid = static_cast<int>(cred.uid);
      p->gid = static_cast<int>(cred.gid);
      if (allowUid_ >= 0 && static_cast<int64_t>(cred.uid) != allowUid_) {
        p->phase = Phase::Dropping;
        p->deadline = 0;
        Emit(p->id, kRefused, "", p);
      }
    }
  }

  // Reads what is there. Returns false when the connection was dropped.
  bool ReadSome(Conn* c) {
    char buf[16384];
    for (;;) {
      ssize_t n = read(c->fd, buf, sizeof buf);
      if (n > 0) {
        if (c->phase != Phase::Reading) continue;  // dropping: the answer is decided
        if (c->in.size() + static_cast<size_t>(n) > maxBytes_) {
          std::string().swap(c->in);
          c->phase = Phase::Dropping;
          c->deadline = 0;
          Emit(c->id, kTooBig, "", c);
          continue;
        }
        c->in.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) {
        if (c->phase == Phase::Lingering) {  // answered, and now closed by the client too
          Drop(c);
          return false;
        }
        c->eof = true;
        Interest(c, c->phase == Phase::Writing ? EPOLLOUT : 0);
        if (c->phase == Phase::Reading) {
          c->phase = Phase::Waiting;
          c->deadline = 0;
          std::string req;
          req.swap(c->in);
          Emit(c->id, kRequest, std::move(req), c);
        }
        return true;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      if (errno == EINTR) continue;
      // ECONNRESET and the like: the forwarder is gone; nobody to answer.
      Drop(c);
      return false;
    }
  }

  void OnReady(Conn* c, uint32_t events) {
    if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !c->eof && !ReadSome(c)) return;
    if (c->phase == Phase::Writing && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) Flush(c);
  }

  void TakeReplies() {
    std::deque<std::pair<uint64_t, std::string>> q;
    {
      std::lock_guard<std::mutex> lock(sh_->mu);
      q.swap(sh_->replies);
    }
    for (auto& [id, text] : q) {
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;  // the client went away first
      Conn* c = it->second.get();
      if (c->phase == Phase::Writing || c->phase == Phase::Lingering) continue;  // answered once
      c->out = std::move(text);
      c->outOff = 0;
      c->deadline = 0;
      c->phase = Phase::Writing;
      Flush(c);
    }
  }

  void Flush(Conn* c) {
    while (c->outOff < c->out.size()) {
      ssize_t n = send(c->fd, c->out.data() + c->outOff, c->out.size() - c->outOff, MSG_NOSIGNAL);
      if (n >= 0) {
        c->outOff += static_cast<size_t>(n);
        continue;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        Interest(c, c->eof ? EPOLLOUT : (EPOLLIN | EPOLLOUT));
        return;
      }
      Drop(c);  // EPIPE, ECONNRESET: the forwarder is gone
      return;
    }
    std::string().swap(c->out);
    if (c->eof) {
      Drop(c);
      return;
    }
    // The client may still be sending (refused, too big, timed out): keep
    // reading so it is not stuck on a full buffer and reads the answer;
    // give it readTimeoutMs to close.
    shutdown(c->fd, SHUT_WR);
    c->phase = Phase::Lingering;
    c->deadline = NowMs() + timeoutMs_;
    Interest(c, EPOLLIN);
  }

  void Expire() {
    int64_t now = NowMs();
    if (listenPausedUntil_ != 0 && now >= listenPausedUntil_) {
      listenPausedUntil_ = 0;
      Watch(listenFd_, kListenTag, EPOLLIN);
    }
    std::vector<Conn*> due;
    for (auto& [id, c] : conns_)
      if (c->deadline != 0 && now >= c->deadline) due.push_back(c.get());
    for (Conn* c : due) {
      if (c->phase == Phase::Lingering) {
        Drop(c);
        continue;
      }
      if (c->phase != Phase::Reading) {
        c->deadline = 0;
        continue;
      }
      // What arrived in time counts: read it before deciding.
      if (!ReadSome(c)) continue;
      if (c->phase != Phase::Reading) continue;
      std::string().swap(c->in);
      c->phase = Phase::Dropping;
      c->deadline = 0;
      Emit(c->id, kTimeout, "", c);
    }
  }

  void Drop(Conn* c) {
    close(c->fd);  // also takes it out of epoll
    conns_.erase(c->id);
    sh_->open.store(static_cast<uint32_t>(conns_.size()));
  }

  int listenFd_;
  std::shared_ptr<Shared> sh_;
  Napi::ThreadSafeFunction tsfn_;
  size_t maxBytes_;
  int64_t timeoutMs_;
  int64_t allowUid_;
  int ep_ = -1;
  uint64_t nextId_ = kFirstId;
  int64_t listenPausedUntil_ = 0;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
};

class CniListenerWrap : public Napi::ObjectWrap<CniListenerWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "CniListener",
                       {InstanceMethod<&CniListenerWrap::Reply>("reply"),
                        InstanceMethod<&CniListenerWrap::Close>("close"),
                        InstanceAccessor<&CniListenerWrap::Open>("open")});
  }

  // new CniListener(path, { maxRequestBytes, readTimeoutMs, allowUid, backlog }, onEvent)
  explicit CniListenerWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<CniListenerWrap>(info) {
    Napi::Env env = info.Env();
    std::string path = ArgString(info, 0, "CniListener", "path");
    if (info.Length() < 2 || !info[1].IsObject()) ThrowType(env, "CniListener: options must be an object");
    Napi::Object o = info[1].As<Napi::Object>();
    auto num = [&](const char* k, double lo, double hi) {
      Napi::Value v = o.Get(k);
      if (!v.IsNumber()) ThrowType(env, std::string("CniListener: options.") + k + " must be a number");
      double d = v.As<Napi::Number>().DoubleValue();
      if (!(d >= lo && d <= hi) || d != static_cast<double>(static_cast<int64_t>(d)))
        ThrowType(env, std::string("CniListener: options.") + k + " must be an integer in [" +
                           std::to_string(static_cast<int64_t>(lo)) + ", " + std::to_string(static_cast<int64_t>(hi)) + "]");
      return static_cast<int64_t>(d);
    };
    int64_t maxBytes = num("maxRequestBytes", 1, 1 << 30);
    int64_t timeoutMs = num("readTimeoutMs", 1, 3600 * 1000);
    int64_t allowUid = num("allowUid", -1, UINT32_MAX);
    int64_t backlog = num("backlog", 1, 65535);
    if (info.Length() < 3 || !info[2].IsFunction()) ThrowType(env, "CniListener: onEvent must be a function");

    struct sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path)
      ThrowNativeError(env, ENAMETOOLONG, "bind", path + " (a unix socket path holds at most " +
                                                       std::to_string(sizeof addr.sun_path - 1) + " bytes)");
    memcpy(addr.sun_path, path.data(), path.size());

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) ThrowNativeError(env, errno, "socket(AF_UNIX)", path);
    // Created 0600, not chmod'ed after: no moment in which others may connect.
    mode_t old = umask(0177);
    int rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    int err = errno;
    umask(old);
    if (rc != 0) {
      close(fd);
      ThrowNativeError(env, err, "bind", path);
    }
    if (listen(fd, static_cast<int>(backlog)) != 0) {
      err = errno;
      close(fd);
      unlink(path.c_str());
      ThrowNativeError(env, err, "listen", path);
    }
    sh_ = std::make_shared<Shared>();
    sh_->wakeFd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (sh_->wakeFd < 0) {
      err = errno;
      close(fd);
      unlink(path.c_str());
      ThrowNativeError(env, err, "eventfd", path);
    }
    listenFd_ = fd;
    tsfn_ = Napi::ThreadSafeFunction::New(env, info[2].As<Napi::Function>(), "meshcap:cni-listener", 0, 1);
    loop_ = std::make_unique<Loop>(fd, sh_, tsfn_, static_cast<size_t>(maxBytes), timeoutMs, allowUid);
    if ((err = loop_->Init()) != 0) {
      Teardown();
      unlink(path.c_str());
      ThrowNativeError(env, err, "epoll", path);
    }
    thread_ = std::thread([l = loop_.get()] { l->Run(); });
  }

  ~CniListenerWrap() override { Teardown(); }

 private:
  // reply(id, text): false when that connection is gone (or the listener closed).
  Napi::Value Reply(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsString())
      ThrowType(env, "CniListener.reply(id, text): id must be a number and text a string");
    if (sh_->closed.load()) return Napi::Boolean::New(env, false);
    uint64_t id = static_cast<uint64_t>(info[0].As<Napi::Number>().Int64Value());
    std::string text = info[1].As<Napi::String>().Utf8Value();
    {
      std::lock_guard<std::mutex> lock(sh_->mu);
      sh_->replies.emplace_back(id, std::move(text));
    }
    uint64_t one = 1;
    (void)!write(sh_->wakeFd, &one, sizeof one);
    return Napi::Boolean::New(env, true);
  }

  // close(): stops accepting, cuts open connections (no answer), joins the
  // thread. The socket file is the caller's to remove.
  Napi::Value Close(const Napi::CallbackInfo& info) {
    Teardown();
    return info.Env().Undefined();
  }

  Napi::Value Open(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), sh_ ? sh_->open.load() : 0);
  }

  void Teardown() {
    if (!sh_ || sh_->closed.exchange(true)) return;
    if (thread_.joinable()) {
      uint64_t one = 1;
      (void)!write(sh_->wakeFd, &one, sizeof one);
      thread_.join();
    }
    if (listenFd_ >= 0) close(listenFd_);
    listenFd_ = -1;
    close(sh_->wakeFd);
    tsfn_.Release();
  }

  std::shared_ptr<Shared> sh_;
  int listenFd_ = -1;
  Napi::ThreadSafeFunction tsfn_;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

}  // namespace

void InitCniListener(Napi::Env env, Napi::Object exports) {
  exports.Set("CniListener", CniListenerWrap::Define(env));
}

}  // namespace meshcap
