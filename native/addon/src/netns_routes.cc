// netnsReplyRoutes(path, op, addrs, table, protocol): the pod's route for the
// replies of its redirected connections, written over rtnetlink through a
// socket made in the pod's netns.
//
// Why: a redirected connection leaves from the pod's address (as under
// REDIRECT), so the proxy's SYN-ACK and its accepted socket route to that
// address. Its local route belongs to the pod's interface, not to lo, and the
// kernel does not cache such a route (net/ipv4/route.c, __mkroute_output:
// RTN_LOCAL with orig_oif != the loopback device): two route allocations per
// connection, about 1 us (docs/bench-datapath.md). The same address routed on
// lo is cached. Only for TCP from 127.0.0.0/8: a reply of the proxy (or
// Envoy's inbound passthrough from 127.0.0.6) arrives then "on lo" rather
// than on the pod's interface, which only a socket bound to that interface
// could tell, and such a socket cannot answer 127/8 anyway; the pod's own
// traffic to its address (UDP, or from the address itself) keeps the
// kernel's route.
//
// Taken back (2026-11-30): a rule in a netns sends every route lookup there
// through the rules, which cost the pod's other traffic more than the
// replies gained (docs/bench-datapath.md). No build adds them any more;
// `remove` takes them out of pods the builds from 0b6b34f to eed882e gave
// them, and `add` stays so the tests can make such a pod.
//
// add:    a route `local ADDR dev lo src ADDR` in `table` for each address the
//         netns has as local (others are left alone), a rule
//         `pref 0 from 127.0.0.0/8 to ADDR ipproto tcp lookup table` for each,
//         and the rules placed before the local table's (which moves after
//         them, still at pref 0: moving it to another pref would put rules a
//         pod may have at low prefs, e.g. source-based routing, before it).
// remove: the rules and routes again; the local table's rule stays first.
//         Nothing but one dump where the netns has no rule of ours.
// Every step can be repeated (a retried ADD, an agent restarted mid-way).
// A first add takes 4-5 requests and no dump; a repeated add reads the
// rules once to check their order.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/fib_rules.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common.h"

namespace meshcap {

namespace {

// One rtnetlink socket, requests answered in order.
class Rtnl {
 public:
  ~Rtnl() {
    if (fd_ >= 0) close(fd_);
  }
  // 0 or an errno.
  int Open() {
    fd_ = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (fd_ < 0) return errno;
    sockaddr_nl sa{};
    sa.nl_family = AF_NETLINK;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) < 0) return errno;
    return 0;
  }

  // Sends msg (its nlmsghdr first) and returns the ACK's errno (0: done).
  int Request(std::vector<uint8_t>& msg) {
    return Exchange(msg, [](const nlmsghdr*) {});
  }

  // Sends a request (NLM_F_DUMP: a dump) and hands each answer to each. 0 or an errno.
  int Exchange(std::vector<uint8_t>& msg, const std::function<void(const nlmsghdr*)>& each) {
    auto* h = reinterpret_cast<nlmsghdr*>(msg.data());
    h->nlmsg_len = static_cast<uint32_t>(msg.size());
    h->nlmsg_seq = ++seq_;
    bool dump = (h->nlmsg_flags & NLM_F_DUMP) == NLM_F_DUMP;
    if (send(fd_, msg.data(), msg.size(), 0) < 0) return errno;
    if (buf_.empty()) buf_.resize(32768);
    for (;;) {
      ssize_t n = recv(fd_, buf_.data(), buf_.size(), 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno;
      }
      int len = static_cast<int>(n);
      for (auto* r = reinterpret_cast<nlmsghdr*>(buf_.data()); NLMSG_OK(r, len); r = NLMSG_NEXT(r, len)) {
        if (r->nlmsg_seq != seq_) continue;
        if (r->nlmsg_type == NLMSG_DONE) return 0;
        if (r->nlmsg_type == NLMSG_ERROR) {
          auto* e = static_cast<nlmsgerr*>(NLMSG_DATA(r));
          if (e->error != 0 || !dump) return -e->error;
          continue;
        }
        each(r);
        if (!dump) return 0;
      }
    }
  }

 private:
  int fd_ = -1;
  uint32_t seq_ = 0;
  std::vector<uint8_t> buf_;  // answers, kept for the requests that follow
};

void PutAttr(std::vector<uint8_t>& msg, uint16_t type, const void* data, size_t len) {
  size_t at = NLMSG_ALIGN(msg.size());
  msg.resize(at + RTA_SPACE(len));
  auto* a = reinterpret_cast<rtattr*>(msg.data() + at);
  a->rta_type = type;
  a->rta_len = static_cast<uint16_t>(RTA_LENGTH(len));
  std::memcpy(RTA_DATA(a), data, len);
}
void PutU32(std::vector<uint8_t>& msg, uint16_t type, uint32_t v) { PutAttr(msg, type, &v, sizeof(v)); }

template <typename Body>
std::vector<uint8_t> Message(uint16_t type, uint16_t flags, const Body& body) {
  std::vector<uint8_t> msg(NLMSG_SPACE(sizeof(Body)));
  auto* h = reinterpret_cast<nlmsghdr*>(msg.data());
  h->nlmsg_type = type;
  h->nlmsg_flags = static_cast<uint16_t>(NLM_F_REQUEST | flags);
  std::memcpy(NLMSG_DATA(h), &body, sizeof(Body));
  return msg;
}

constexpr uint32_t kLoopbackNet = 0x7f000000;  // 127.0.0.0/8, host order
// lo in every netns (LOOPBACK_IFINDEX): the first device a netns gets
constexpr uint32_t kLoopbackIfindex = 1;

// A rule as the dump lists it: only what tells ours and the local table's apart.
struct RuleSeen {
  uint32_t table = 0;
  uint8_t srcLen = 0, dstLen = 0;
  uint32_t src = 0, dst = 0;  // network order
  bool selectors = false;     // anything else (iif, fwmark, ...) set
};

class ReplyRoutes {
 public:
  ReplyRoutes(std::string path, bool add, std::vector<std::string> addrs, uint32_t table, uint8_t protocol)
      : path_(std::move(path)), add_(add), addrs_(std::move(addrs)), table_(table), protocol_(protocol) {}

  // Runs on the calling (JS) thread: the 4-5 requests of a first add take
  // ~40 us of kernel time, less than a hop to the libuv pool, whose threads
  // the inbound pool's refills keep busy in a burst of ADDs.
  void RunOrThrow(Napi::Env env) {
    Run();
    if (err_) ThrowNativeError(env, err_, syscall_, path_ + (what_.empty() ? "" : ": " + what_));
  }

 private:
  bool Fail(int err, const char* syscall, std::string what) {
    err_ = err;
    syscall_ = syscall;
    what_ = std::move(what);
    return false;
  }

  void Run() {
    // Only the netlink socket needs the pod's netns (a socket belongs to the
    // netns it was made in): this thread steps in to make it and back at
    // once, about 1 us, with nothing else run in between. A thread of its
    // own cost 43 us here, more than the route write itself.
    int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0) return void(Fail(errno, "open", "/proc/thread-self/ns/net"));
    int ns = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0) {
      Fail(errno, "open", "");
      close(self);
      return;
    }
    int r = setns(ns, CLONE_NEWNET);
    int e = errno;
    close(ns);
    if (r < 0) {
      close(self);
      return void(Fail(e, "setns", ""));
    }
    int opened = nl_.Open();
    // the agent's thread left in a pod's netns would run all its next work there
    if (setns(self, CLONE_NEWNET) < 0) std::abort();
    close(self);
    if (opened != 0) return void(Fail(opened, "socket(NETLINK_ROUTE)", ""));
    std::vector<uint32_t> addrs;
    for (const auto& s : addrs_) {
      in_addr a{};
      if (inet_pton(AF_INET, s.c_str(), &a) != 1) return void(Fail(EINVAL, "inet_pton", s));
      addrs.push_back(a.s_addr);
    }
    if (add_) Add(addrs);
    else Remove(addrs);
  }

  // ---- requests

  bool IsLocal(uint32_t addr, bool* local) {
    rtmsg m{};
    m.rtm_family = AF_INET;
    m.rtm_dst_len = 32;
    auto msg = Message(RTM_GETROUTE, 0, m);
    PutAttr(msg, RTA_DST, &addr, 4);
    *local = false;
    int r = nl_.Exchange(msg, [&](const nlmsghdr* h) {
      if (h->nlmsg_type == RTM_NEWROUTE) *local = static_cast<const rtmsg*>(NLMSG_DATA(h))->rtm_type == RTN_LOCAL;
    });
    // no route at all: not local either
    if (r == ENETUNREACH || r == EHOSTUNREACH) return true;
    return r == 0 || Fail(r, "RTM_GETROUTE", Ip(addr));
  }

  bool Route(uint16_t type, uint16_t flags, uint32_t addr) {
    rtmsg m{};
    m.rtm_family = AF_INET;
    m.rtm_dst_len = 32;
    m.rtm_table = RT_TABLE_UNSPEC;
    m.rtm_protocol = protocol_;
    m.rtm_scope = RT_SCOPE_HOST;
    m.rtm_type = RTN_LOCAL;
    auto msg = Message(type, NLM_F_ACK | flags, m);
    PutAttr(msg, RTA_DST, &addr, 4);
    PutU32(msg, RTA_TABLE, table_);
    if (type == RTM_NEWROUTE) {
      PutU32(msg, RTA_OIF, kLoopbackIfindex);
      PutAttr(msg, RTA_PREFSRC, &addr, 4);
    }
    int r = nl_.Request(msg);
    if (r == 0 || (type == RTM_DELROUTE && r == ESRCH)) return true;
    return Fail(r, type == RTM_NEWROUTE ? "RTM_NEWROUTE" : "RTM_DELROUTE",
                "local " + Ip(addr) + " dev lo table " + std::to_string(table_));
  }

  // Ours: pref 0 from 127.0.0.0/8 to addr ipproto tcp lookup table_.
  // *changed: the kernel added (removed) it; false where it was there (gone).
  bool OurRule(uint16_t type, uint32_t addr, bool* changed) {
    fib_rule_hdr h{};
    h.family = AF_INET;
    h.src_len = 8;
    h.dst_len = 32;
    h.action = FR_ACT_TO_TBL;
    auto msg = Message(type, NLM_F_ACK | (type == RTM_NEWRULE ? NLM_F_CREATE | NLM_F_EXCL : 0), h);
    uint32_t src = htonl(kLoopbackNet);
    PutU32(msg, FRA_PRIORITY, 0);
    PutAttr(msg, FRA_SRC, &src, 4);
    PutAttr(msg, FRA_DST, &addr, 4);
    uint8_t proto = IPPROTO_TCP;
    PutAttr(msg, FRA_IP_PROTO, &proto, 1);
    PutU32(msg, FRA_TABLE, table_);
    int r = nl_.Request(msg);
    *changed = r == 0;
    if (r == 0 || (type == RTM_NEWRULE && r == EEXIST) || (type == RTM_DELRULE && r == ENOENT)) return true;
    return Fail(r, type == RTM_NEWRULE ? "RTM_NEWRULE" : "RTM_DELRULE",
                "pref 0 from 127.0.0.0/8 to " + Ip(addr) + " ipproto tcp lookup " + std::to_string(table_));
  }

  // The local table's rule at pref 0: added (a second one, after every rule
  // at pref 0) or removed (the first one the kernel finds: a delete matches
  // by table and ignores a pref of 0).
  bool LocalRule(uint16_t type) {
    fib_rule_hdr h{};
    h.family = AF_INET;
    h.table = RT_TABLE_LOCAL;
    h.action = FR_ACT_TO_TBL;
    auto msg = Message(type, NLM_F_ACK | (type == RTM_NEWRULE ? NLM_F_CREATE : 0), h);
    PutU32(msg, FRA_PRIORITY, 0);
    int r = nl_.Request(msg);
    return r == 0 || Fail(r, type == RTM_NEWRULE ? "RTM_NEWRULE" : "RTM_DELRULE", "pref 0 lookup local");
  }

  bool Rules(std::vector<RuleSeen>* out) {
    fib_rule_hdr h{};
    h.family = AF_INET;
    auto msg = Message(RTM_GETRULE, NLM_F_DUMP, h);
    out->clear();
    int r = nl_.Exchange(msg, [&](const nlmsghdr* m) {
      if (m->nlmsg_type != RTM_NEWRULE) return;
      auto* fh = static_cast<const fib_rule_hdr*>(NLMSG_DATA(m));
      if (fh->family != AF_INET) return;
      RuleSeen s;
      s.table = fh->table;
      s.srcLen = fh->src_len;
      s.dstLen = fh->dst_len;
      int len = static_cast<int>(m->nlmsg_len - NLMSG_LENGTH(sizeof(*fh)));
      for (auto* a = reinterpret_cast<const rtattr*>(reinterpret_cast<const uint8_t*>(fh) + NLMSG_ALIGN(sizeof(*fh)));
           RTA_OK(a, len); a = RTA_NEXT(a, len)) {
        const void* d = RTA_DATA(a);
        switch (a->rta_type) {
          case FRA_TABLE: std::memcpy(&s.table, d, 4); break;
          case FRA_SRC: std::memcpy(&s.src, d, 4); break;
          case FRA_DST: std::memcpy(&s.dst, d, 4); break;
          case FRA_IIFNAME: case FRA_OIFNAME: case FRA_FWMARK: case FRA_UID_RANGE: case FRA_L3MDEV:
          case FRA_SPORT_RANGE: case FRA_DPORT_RANGE: case FRA_TUN_ID:
            s.selectors = true;
            break;
          default: break;
        }
      }
      out->push_back(s);
    });
    return r == 0 || Fail(r, "RTM_GETRULE", "dump");
  }

  bool IsOurs(const RuleSeen& s, uint32_t addr) const {
    return s.table == table_ && s.srcLen == 8 && s.src == htonl(kLoopbackNet) && s.dstLen == 32 && s.dst == addr;
  }
  static bool IsLocalTable(const RuleSeen& s) {
    return s.table == RT_TABLE_LOCAL && s.srcLen == 0 && s.dstLen == 0 && !s.selectors;
  }
  // Whether a rule that looks up the local table comes before one of ours.
  bool LocalFirst(const std::vector<RuleSeen>& rules, const std::vector<uint32_t>& ours) const {
    bool local = false;
    for (const auto& s : rules) {
      if (IsLocalTable(s)) local = true;
      for (uint32_t a : ours)
        if (IsOurs(s, a) && local) return true;
    }
    return false;
  }

  void Add(const std::vector<uint32_t>& addrs) {
    std::vector<uint32_t> ours;
    bool existed = false;
    for (uint32_t a : addrs) {
      bool local = false;
      if (!IsLocal(a, &local)) return;
      // an address the netns does not have is not made local here
      if (!local) continue;
      bool added = false;
      if (!Route(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, a) || !OurRule(RTM_NEWRULE, a, &added)) return;
      if (!added) existed = true;
      ours.push_back(a);
    }
    if (ours.empty()) return;
    if (!existed) {
      // A new rule at pref 0 goes after every rule there, the local
      // table's too: a second local rule goes after ours, then the first
      // one goes (a delete takes the first rule of that table). There is
      // always one, so the pod's own traffic never misses the local table.
      if (LocalRule(RTM_NEWRULE)) LocalRule(RTM_DELRULE);
      return;
    }
    // Registered before (a retried ADD, a restarted agent): in place unless
    // an earlier attempt stopped half-way; the rules say which.
    std::vector<RuleSeen> rules;
    for (int i = 0; i < 3; i++) {
      if (!Rules(&rules)) return;
      if (!LocalFirst(rules, ours)) return;
      if (i == 2) break;
      if (!LocalRule(RTM_NEWRULE) || !LocalRule(RTM_DELRULE)) return;
    }
    Fail(EAGAIN, "RTM_NEWRULE", "the local table's rule stays before meshcap's reply rules");
  }

  void Remove(const std::vector<uint32_t>& addrs) {
    // Looked at first (a dump needs no CAP_NET_ADMIN): in a netns without
    // rules of ours, which is every pod registered since the route was taken
    // back, nothing is written. Even a rule added and deleted again would
    // leave its route lookups on the rules' path for good: the kernel never
    // merges the local and main tables back.
    std::vector<RuleSeen> rules;
    if (!Rules(&rules)) return;
    bool any = false;
    for (const auto& s : rules)
      for (uint32_t a : addrs) any = any || IsOurs(s, a);
    if (!any) return;
    // A local rule after ours first, so one is there throughout; then ours,
    // then the first local rule: the one that had moved after ours, or,
    // where there were none of ours, the one that was there (the second,
    // just added, stays). Either way the pod ends with the rules it had.
    if (!LocalRule(RTM_NEWRULE)) return;
    bool removed = false;
    for (uint32_t a : addrs)
      if (!OurRule(RTM_DELRULE, a, &removed)) return;
    if (!LocalRule(RTM_DELRULE)) return;
    for (uint32_t a : addrs)
      if (!Route(RTM_DELROUTE, 0, a)) return;
  }

  static std::string Ip(uint32_t a) {
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a, buf, sizeof(buf));
    return buf;
  }

  std::string path_;
  bool add_;
  std::vector<std::string> addrs_;
  uint32_t table_;
  uint8_t protocol_;
  Rtnl nl_;
  int err_ = 0;
  const char* syscall_ = "";
  std::string what_;
};

Napi::Value NetnsReplyRoutes(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = ArgString(info, 0, "netnsReplyRoutes", "netnsPath");
  std::string op = ArgString(info, 1, "netnsReplyRoutes", "op");
  if (op != "add" && op != "remove") ThrowType(env, "netnsReplyRoutes: op must be 'add' or 'remove', got " + op);
  if (!info[2].IsArray()) ThrowType(env, "netnsReplyRoutes: addrs must be an array of IPv4 addresses");
  Napi::Array arr = info[2].As<Napi::Array>();
  std::vector<std::string> addrs;
  for (uint32_t i = 0; i < arr.Length(); i++) {
    Napi::Value v = arr.Get(i);
    if (!v.IsString()) ThrowType(env, "netnsReplyRoutes: addrs[" + std::to_string(i) + "] must be a string");
    addrs.push_back(v.As<Napi::String>().Utf8Value());
  }
  uint32_t table = ArgU32(info, 3, "netnsReplyRoutes", "table");
  uint32_t protocol = ArgU32(info, 4, "netnsReplyRoutes", "protocol");
  // not the kernel's own tables (unspec, compat, default, main, local)
  if (table == RT_TABLE_UNSPEC || table >= 252 && table <= 255)
    ThrowType(env, "netnsReplyRoutes: table " + std::to_string(table) + " is one of the kernel's own");
  if (protocol <= RTPROT_STATIC || protocol > 255)
    ThrowType(env, "netnsReplyRoutes: protocol must be 5..255 (a route protocol of its own), got " + std::to_string(protocol));
  ReplyRoutes r(path, op == "add", std::move(addrs), table, static_cast<uint8_t>(protocol));
  r.RunOrThrow(env);
  return env.Undefined();
}

}  // namespace

void InitNetnsRoutes(Napi::Env env, Napi::Object exports) {
  exports.Set("netnsReplyRoutes", Napi::Function::New(env, NetnsReplyRoutes, "netnsReplyRoutes"));
}

}  // namespace meshcap
