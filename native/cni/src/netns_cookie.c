#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* setns, CLONE_NEWNET (the build defines it too) */
#endif
#include "netns_cookie.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71
#endif

/* Why here and not in the agent: the agent must not setns() any of its own
 * threads (its addon does it on a throwaway thread, behind a libuv pool hop:
 * 0.15 ms quiet, ~0.8 ms under load, on every meshed ADD). This process is
 * single-threaded and ends in a moment, so a setns() here costs a few
 * syscalls. The agent's socket is a pathname socket, reachable from any
 * netns; the forwarder goes back to its own anyway. */
int netns_cookie_of(const char *path, uint64_t *out) {
  int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (self < 0) return errno;
  int ns = open(path, O_RDONLY | O_CLOEXEC);
  if (ns < 0) {
    int e = errno;
    close(self);
    return e;
  }
  int err = 0;
  if (setns(ns, CLONE_NEWNET) < 0) {
    err = errno;
  } else {
    int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) {
      err = errno;
    } else {
      socklen_t len = sizeof *out;
      if (getsockopt(s, SOL_SOCKET, SO_NETNS_COOKIE, out, &len) < 0) err = errno;
      else if (len != sizeof *out) err = EINVAL;
      close(s);
    }
    if (setns(self, CLONE_NEWNET) < 0 && err == 0) err = errno;
  }
  close(ns);
  close(self);
  return err;
}
