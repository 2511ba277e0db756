// bench:scale --listen: a proxy's listening sockets in each pod's network
// namespace, as Envoy opens them in a meshed Istio pod (the inbound port on
// 0.0.0.0 and [::], the outbound port on 0.0.0.0), so that the node's
// sockops program fills mc_listen as on a real node. WORKERS sockets per
// listener (SO_REUSEPORT, as Envoy opens one per worker thread: Istio's
// sidecars run 2). Held open until stdin closes; nothing connects to them
// (each namespace's lo is down).
//
// First says "cap PODS": how many pods' sockets its open-file limit allows
// (raised to the hard limit; an unprivileged hard limit of 20,000 allows
// ~6,600 pods at one worker, so bench:scale starts as many helpers as it
// needs). stdin: "INBOUND_PORT OUTBOUND_PORT WORKERS" once, then one netns path per line; an
// empty line ends a batch, answered "ok SOCKETS" (the sockets held in all) or
// "error PATH: WHAT" (then the helper exits 1).
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

static int listen_on(int family, int port, int reuseport) {
  int s = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  int one = 1;
  if (reuseport && setsockopt(s, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0) goto fail;
  if (family == AF_INET6 && setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) < 0) goto fail;
  if (family == AF_INET) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = {htonl(INADDR_ANY)}};
    if (bind(s, (struct sockaddr *)&a, sizeof a) < 0) goto fail;
  } else {
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(port), .sin6_addr = IN6ADDR_ANY_INIT};
    if (bind(s, (struct sockaddr *)&a, sizeof a) < 0) goto fail;
  }
  if (listen(s, 16) < 0) goto fail;
  return s;
fail:;
  int e = errno;
  close(s);
  errno = e;
  return -1;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  struct rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) < 0) {
    printf("error getrlimit: %s\n", strerror(errno));
    return 1;
  }
  if (r.rlim_max == RLIM_INFINITY || r.rlim_max > (1u << 20)) r.rlim_max = 1u << 20;
  r.rlim_cur = r.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &r) < 0) {
    printf("error setrlimit: %s\n", strerror(errno));
    return 1;
  }
  // the first line read whole: scanf's "\n" would wait for the next line's first byte,
  // and the bench sends none before it has read the "cap" answer
  char first[128];
  int inbound, outbound, workers;
  if (!fgets(first, sizeof first, stdin) || sscanf(first, "%d %d %d", &inbound, &outbound, &workers) != 3 || inbound <= 0 || inbound > 65535 || outbound <= 0 || outbound > 65535 ||
      workers < 1 || workers > 64) {
    printf("error the first line must be \"INBOUND_PORT OUTBOUND_PORT WORKERS\" (WORKERS 1..64)\n");
    return 1;
  }
  // three listeners per pod, WORKERS sockets each; stdio, the namespace fd in use and a margin besides
  printf("cap %ld\n", ((long)r.rlim_cur - 32) / (3L * workers));
  long held = 0;
  char line[4096];
  while (fgets(line, sizeof line, stdin)) {
    line[strcspn(line, "\n")] = 0;
    if (line[0] == 0) {
      printf("ok %ld\n", held);
      continue;
    }
    int ns = open(line, O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) < 0) {
      printf("error %s: %s\n", line, strerror(errno));
      return 1;
    }
    close(ns);
    const struct { int family, port; } want[] = {{AF_INET, inbound}, {AF_INET6, inbound}, {AF_INET, outbound}};
    for (unsigned i = 0; i < sizeof want / sizeof want[0]; i++) {
      for (int w = 0; w < workers; w++) {
        if (listen_on(want[i].family, want[i].port, workers > 1) < 0) {
          printf("error %s: listen on %s port %d: %s\n", line, want[i].family == AF_INET ? "0.0.0.0" : "[::]", want[i].port, strerror(errno));
          return 1;
        }
        held++;
      }
    }
  }
  return 0;
}
