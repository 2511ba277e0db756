#include "bounded_io.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for events on fd until the deadline: 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short events, int64_t deadline_ms) {
  for (;;) {
    int64_t left = deadline_ms - mono_ms();
    if (left <= 0) return 0;
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, left > 60000 ? 60000 : (int)left);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r > 0) return 1;
  }
}

ssize_t read_bounded(int fd, char *buf, size_t cap, int64_t deadline_ms) {
  size_t len = 0;
  for (;;) {
    int w = wait_fd(fd, POLLIN, deadline_ms);
    if (w == 0) return BIO_TIMEOUT;
    if (w < 0) return BIO_ERROR;
    char probe;
    /* Once the buffer is full, one more byte tells "exactly cap" from "too big". */
    char *dst = len < cap ? buf + len : &probe;
    size_t room = len < cap ? cap - len : 1;
    ssize_t n = read(fd, dst, room);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return BIO_ERROR;
    }
    if (n == 0) return (ssize_t)len;
    if (len == cap) return BIO_TOO_BIG;
    len += (size_t)n;
  }
}

int send_all(int fd, const char *buf, size_t len, int64_t deadline_ms) {
  while (len > 0) {
    ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return BIO_ERROR;
      int w = wait_fd(fd, POLLOUT, deadline_ms);
      if (w == 0) return BIO_TIMEOUT;
      if (w < 0) return BIO_ERROR;
      continue;
    }
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}
