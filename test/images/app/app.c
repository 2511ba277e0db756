// meshcap-app: the application of the test images (localhost/meshcap-app:dev).
// One static binary, no libc files needed at run time, numeric addresses only
// (no resolver in a FROM scratch image).
//
//   meshcap-app serve [--port N]...      listen on each port (default 8080), v4+v6
//   meshcap-app dial ADDR:PORT [TEXT]    one connection; prints the server's answer
//   meshcap-app stream ADDR:PORT [--count N] [--interval-ms M]
//                                        N connections one after another (bounded),
//                                        one line each, then a JSON summary; exit 1
//                                        when any failed
//
// Protocol, one line each way: the client sends "TEXT\n"; the server answers
// "<hostname> <local addr:port> <peer addr:port> TEXT\n". A line
// "DIAL ADDR:PORT TEXT" makes the server dial ADDR:PORT itself with TEXT and
// answer "DIALED <that server's answer>" (outbound from a server pod on
// request). A line starting with "GET " gets the same answer as an HTTP/1.0
// 200 response, so httpGet probes work.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LINE_MAX_LEN 1024
#define IO_TIMEOUT_MS 5000
#define MAX_PORTS 16
#define MAX_STREAM 1000000

static void on_term(int sig) {
  (void)sig;
  _exit(0); // as PID 1 SIGTERM is ignored unless handled: pod deletion stays fast
}

static int parse_addr(const char *s, struct sockaddr_storage *ss, socklen_t *len) {
  char host[128];
  const char *colon = strrchr(s, ':');
  if (!colon || colon == s) return -1;
  size_t hl = (size_t)(colon - s);
  if (s[0] == '[') {
    if (hl < 3 || s[hl - 1] != ']') return -1;
    s++;
    hl -= 2;
  }
  if (hl >= sizeof host) return -1;
  memcpy(host, s, hl);
  host[hl] = 0;
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (*end || port < 1 || port > 65535) return -1;
  memset(ss, 0, sizeof *ss);
  struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
  if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)port);
    *len = sizeof *a4;
    return 0;
  }
  if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)port);
    *len = sizeof *a6;
    return 0;
  }
  return -1;
}

static void fmt_addr(const struct sockaddr_storage *ss, char *out, size_t n) {
  char h[INET6_ADDRSTRLEN] = "?";
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
    inet_ntop(AF_INET, &a->sin_addr, h, sizeof h);
    snprintf(out, n, "%s:%u", h, ntohs(a->sin_port));
  } else {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) { // the dual-stack listener's IPv4 peers
      inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], h, sizeof h);
      snprintf(out, n, "%s:%u", h, ntohs(a->sin6_port));
      return;
    }
    inet_ntop(AF_INET6, &a->sin6_addr, h, sizeof h);
    snprintf(out, n, "[%s]:%u", h, ntohs(a->sin6_port));
  }
}

static int wait_fd(int fd, short ev) {
  struct pollfd p = {.fd = fd, .events = ev};
  int r = poll(&p, 1, IO_TIMEOUT_MS);
  if (r == 0) errno = ETIMEDOUT;
  return r > 0 ? 0 : -1;
}

// reads up to '\n' (dropped) or EOF; -1 on error/timeout, else the length
static int read_line(int fd, char *buf, size_t n) {
  size_t got = 0;
  while (got + 1 < n) {
    if (wait_fd(fd, POLLIN) < 0) return -1;
    ssize_t r = read(fd, buf + got, 1);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0 || buf[got] == '\n') break;
    got++;
  }
  buf[got] = 0;
  if (got && buf[got - 1] == '\r') buf[--got] = 0;
  return (int)got;
}

static int write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

// one request/answer exchange with ADDR; answer in out. 0 or -1 (errno set,
// what names the step that failed)
static int exchange(const char *addr, const char *text, char *out, size_t n, const char **what) {
  struct sockaddr_storage ss;
  socklen_t len;
  *what = "address";
  if (parse_addr(addr, &ss, &len) < 0) {
    errno = EINVAL;
    return -1;
  }
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  int rc = -1;
  *what = "connect";
  if (connect(fd, (struct sockaddr *)&ss, len) < 0) {
    if (errno != EINPROGRESS) goto out;
    if (wait_fd(fd, POLLOUT) < 0) goto out;
    int err = 0;
    socklen_t el = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err) {
      errno = err;
      goto out;
    }
  }
  *what = "write";
  char line[LINE_MAX_LEN];
  int ll = snprintf(line, sizeof line, "%s\n", text);
  if (ll < 0 || (size_t)ll >= sizeof line || write_all(fd, line, (size_t)ll) < 0) goto out;
  *what = "read";
  int r = read_line(fd, out, n);
  if (r < 0) goto out;
  if (r == 0) {
    errno = ECONNRESET; // the peer closed without an answer
    goto out;
  }
  rc = 0;
out:;
  int e = errno;
  close(fd);
  errno = e;
  return rc;
}

static void serve_conn(int fd) {
  struct sockaddr_storage local, peer;
  socklen_t ll = sizeof local, pl = sizeof peer;
  char la[64], pa[64], host[64] = "?", line[LINE_MAX_LEN], ans[LINE_MAX_LEN * 2];
  getsockname(fd, (struct sockaddr *)&local, &ll);
  getpeername(fd, (struct sockaddr *)&peer, &pl);
  fmt_addr(&local, la, sizeof la);
  fmt_addr(&peer, pa, sizeof pa);
  gethostname(host, sizeof host - 1);
  if (read_line(fd, line, sizeof line) < 0) return;
  int http = strncmp(line, "GET ", 4) == 0;
  if (strncmp(line, "DIAL ", 5) == 0) {
    char target[128] = "", *text = line + 5, *sp = strchr(text, ' ');
    size_t tl = sp ? (size_t)(sp - text) : strlen(text);
    if (tl >= sizeof target) tl = sizeof target - 1;
    memcpy(target, text, tl);
    char reply[LINE_MAX_LEN];
    const char *what;
    if (exchange(target, sp ? sp + 1 : "", reply, sizeof reply, &what) == 0)
      snprintf(ans, sizeof ans, "DIALED %s\n", reply);
    else
      snprintf(ans, sizeof ans, "DIAL-FAILED %s %s: %s\n", target, what, strerror(errno));
  } else {
    snprintf(ans, sizeof ans, "%s %s %s %s\n", host, la, pa, http ? "http" : line);
  }
  if (http) {
    char hdr[128];
    int hl = snprintf(hdr, sizeof hdr, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n\r\n", strlen(ans));
    write_all(fd, hdr, (size_t)hl);
  }
  write_all(fd, ans, strlen(ans));
}

static int listen_on(int port) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int on = 1, off = 0;
  struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port), .sin6_addr = IN6ADDR_ANY_INIT};
  if (fd >= 0) {
    // dual stack, so IPv4-only pods (no IPv6 at all) fall back to AF_INET below
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 512) == 0) return fd;
    close(fd);
  }
  struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr = {htonl(INADDR_ANY)}};
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (bind(fd, (struct sockaddr *)&a4, sizeof a4) < 0 || listen(fd, 512) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int serve(int nports, const int *ports) {
  struct pollfd pf[MAX_PORTS];
  for (int i = 0; i < nports; i++) {
    pf[i].fd = listen_on(ports[i]);
    pf[i].events = POLLIN;
    if (pf[i].fd < 0) {
      fprintf(stderr, "meshcap-app: listen on port %d: %s\n", ports[i], strerror(errno));
      return 1;
    }
    printf("{\"event\":\"listening\",\"port\":%d}\n", ports[i]);
  }
  fflush(stdout);
  struct sigaction sa = {.sa_handler = SIG_IGN, .sa_flags = SA_NOCLDWAIT};
  sigaction(SIGCHLD, &sa, NULL);
  for (;;) {
    if (poll(pf, (nfds_t)nports, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    for (int i = 0; i < nports; i++) {
      if (!(pf[i].revents & POLLIN)) continue;
      int c = accept4(pf[i].fd, NULL, NULL, SOCK_CLOEXEC);
      if (c < 0) continue;
      pid_t p = fork();
      if (p == 0) {
        serve_conn(c);
        _exit(0);
      }
      close(c);
    }
  }
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int usage(void) {
  fprintf(stderr,
          "usage: meshcap-app serve [--port N]...\n"
          "       meshcap-app dial ADDR:PORT [TEXT]\n"
          "       meshcap-app stream ADDR:PORT [--count N] [--interval-ms M]\n"
          "(numeric addresses only: 198.18.0.1:8080, [2001:db8::1]:8080)\n");
  return 2;
}

int main(int argc, char **argv) {
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) return usage();
  if (strcmp(argv[1], "serve") == 0) {
    int ports[MAX_PORTS], n = 0;
    for (int i = 2; i < argc; i++) {
      if (strcmp(argv[i], "--port") != 0 || i + 1 >= argc || n == MAX_PORTS) return usage();
      int p = atoi(argv[++i]);
      if (p < 1 || p > 65535) return usage();
      ports[n++] = p;
    }
    if (!n) ports[n++] = 8080;
    return serve(n, ports);
  }
  if (strcmp(argv[1], "dial") == 0 && (argc == 3 || argc == 4)) {
    char ans[LINE_MAX_LEN];
    const char *what;
    if (exchange(argv[2], argc == 4 ? argv[3] : "hello", ans, sizeof ans, &what) < 0) {
      fprintf(stderr, "meshcap-app: %s %s: %s\n", what, argv[2], strerror(errno));
      return 1;
    }
    printf("%s\n", ans);
    return 0;
  }
  if (strcmp(argv[1], "stream") == 0 && argc >= 3) {
    long count = 10, interval = 100;
    for (int i = 3; i < argc; i++) {
      if (i + 1 >= argc) return usage();
      if (strcmp(argv[i], "--count") == 0) count = atol(argv[++i]);
      else if (strcmp(argv[i], "--interval-ms") == 0) interval = atol(argv[++i]);
      else return usage();
    }
    if (count < 1 || count > MAX_STREAM || interval < 0 || interval > 60000) return usage();
    long ok = 0, failed = 0;
    for (long i = 0; i < count; i++) {
      char text[32], ans[LINE_MAX_LEN];
      const char *what;
      snprintf(text, sizeof text, "seq-%ld", i);
      double t0 = now_ms();
      if (exchange(argv[2], text, ans, sizeof ans, &what) == 0) {
        ok++;
        printf("ok %ld %.2fms %s\n", i, now_ms() - t0, ans);
      } else {
        failed++;
        printf("fail %ld %s: %s\n", i, what, strerror(errno));
      }
      fflush(stdout);
      if (interval && i + 1 < count) {
        struct timespec ts = {.tv_sec = interval / 1000, .tv_nsec = (interval % 1000) * 1000000L};
        nanosleep(&ts, NULL);
      }
    }
    printf("{\"event\":\"summary\",\"ok\":%ld,\"failed\":%ld}\n", ok, failed);
    return failed ? 1 : 0;
  }
  return usage();
}
