#include "agent_client.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "bounded_io.h"

/* Connect on a non-blocking unix socket: EAGAIN means the listen backlog is
 * full (agent busy), so retry briefly until the deadline rather than fail. */
static int connect_until(int fd, const struct sockaddr_un *addr, int64_t deadline_ms) {
  for (;;) {
    if (connect(fd, (const struct sockaddr *)addr, sizeof *addr) == 0) return 0;
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return BIO_ERROR;
    if (mono_ms() >= deadline_ms) return BIO_TIMEOUT;
    struct pollfd none = {.fd = -1};
    poll(&none, 0, 2);
  }
}

enum agent_status agent_exchange(const char *sock_path, const char *req, size_t req_len,
                                 int64_t deadline_ms, char *reply, size_t reply_cap,
                                 size_t *reply_len, char *why, size_t why_len) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  size_t plen = strlen(sock_path);
  if (plen == 0 || plen >= sizeof addr.sun_path) {
    snprintf(why, why_len, "socket path is empty or longer than %zu bytes", sizeof addr.sun_path - 1);
    return AGENT_UNREACHABLE;
  }
  memcpy(addr.sun_path, sock_path, plen + 1);

  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    snprintf(why, why_len, "socket: %s", strerror(errno));
    return AGENT_UNREACHABLE;
  }
  enum agent_status st = AGENT_UNREACHABLE;
  const char *stage = "connect";
  int r = connect_until(fd, &addr, deadline_ms);
  if (r == 0) {
    stage = "send";
    r = send_all(fd, req, req_len, deadline_ms);
  }
  if (r == 0) {
    /* Half-close: EOF tells the agent the request is complete. */
    shutdown(fd, SHUT_WR);
    stage = "read reply";
    ssize_t n = read_bounded(fd, reply, reply_cap, deadline_ms);
    if (n > 0) {
      *reply_len = (size_t)n;
      st = AGENT_OK;
    } else if (n == 0) {
      snprintf(why, why_len, "agent closed the connection without answering");
    } else if (n == BIO_TOO_BIG) {
      snprintf(why, why_len, "agent reply exceeds %zu bytes", reply_cap);
      st = AGENT_BAD_REPLY;
    } else {
      r = (int)n;
    }
  }
  if (st != AGENT_OK && r == BIO_TIMEOUT)
    snprintf(why, why_len, "no answer before the deadline (%s)", stage);
  else if (st != AGENT_OK && r == BIO_ERROR)
    snprintf(why, why_len, "%s: %s", stage, strerror(errno));
  close(fd);
  return st;
}
