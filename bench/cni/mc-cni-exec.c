/* mc-cni-exec: runs CNI plugins the way a container runtime does and times
 * each from exec to exit, for bench/cni.
 *
 * containerd/CRI-O run plugins through libcni from a Go process: os/exec,
 * i.e. clone(CLONE_VM|CLONE_VFORK) + execve, stdin/stdout on pipes, then
 * wait. A Node parent (child_process.spawn: libuv fork()s the whole Node
 * process, then execs) is slower than that and is not what a runtime pays,
 * so the bench asks this small parent to do the exec: glibc's posix_spawn
 * (clone(CLONE_VM|CLONE_VFORK) as Go does), CLOCK_MONOTONIC from just before
 * posix_spawn to the moment the child's pidfd says it exited.
 *
 * Protocol (one line per job on stdin, one line per result on stdout, in
 * completion order; jobs run concurrently as they arrive):
 *   in:  <id> TAB <binary> TAB <env, entries separated by 0x1f> TAB <stdin text> LF
 *   out: <id> TAB <exit code, or -signal> TAB <microseconds> TAB <child's CPU
 *        microseconds, user + system, from wait4> TAB <child's stdout, LF/TAB -> space> LF
 * The stdin text must hold no LF or TAB (compact JSON). EOF on stdin: finish
 * the running jobs and exit. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_JOBS 256
#define OUT_CAP (1 << 20)

struct job {
  char id[64];
  pid_t pid;
  int pidfd;   /* -1 once exited */
  int out;     /* child's stdout, -1 at EOF */
  int status;
  struct rusage ru;
  int64_t t0_ns, t1_ns;
  char *buf;
  size_t len;
};

static struct job jobs[MAX_JOBS];
static int njobs;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void die(const char *what) {
  fprintf(stderr, "mc-cni-exec: %s: %s\n", what, strerror(errno));
  exit(2);
}

static void start(char *line) {
  char *f[4];
  for (int i = 0; i < 4; i++) {
    f[i] = strsep(&line, "\t");
    if (f[i] == NULL) {
      fprintf(stderr, "mc-cni-exec: malformed job line (want 4 TAB-separated fields)\n");
      exit(2);
    }
  }
  if (njobs == MAX_JOBS) {
    fprintf(stderr, "mc-cni-exec: more than %d jobs at once\n", MAX_JOBS);
    exit(2);
  }
  char *envp[64];
  int ne = 0;
  for (char *e = f[2], *tok; (tok = strsep(&e, "\x1f")) != NULL && ne < 63;)
    if (*tok) envp[ne++] = tok;
  envp[ne] = NULL;
  char *argv[] = {f[1], NULL};

  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0) die("pipe2");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);

  struct job *j = &jobs[njobs];
  snprintf(j->id, sizeof j->id, "%s", f[0]);
  j->t0_ns = now_ns();
  int r = posix_spawn(&j->pid, f[1], &fa, NULL, argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  if (r != 0) {
    errno = r;
    die(f[1]);
  }
  close(in[0]);
  close(out[1]);
  j->pidfd = (int)syscall(SYS_pidfd_open, j->pid, 0);
  if (j->pidfd < 0) die("pidfd_open");
  /* A config is a few KiB, far below the pipe's 64 KiB: this never blocks. */
  size_t n = strlen(f[3]);
  if (write(in[1], f[3], n) != (ssize_t)n && errno != EPIPE) die("write stdin");
  close(in[1]);
  j->out = out[0];
  j->buf = malloc(OUT_CAP);
  if (j->buf == NULL) die("malloc");
  j->len = 0;
  njobs++;
}

static void finish(int i) {
  struct job *j = &jobs[i];
  int code = WIFEXITED(j->status) ? WEXITSTATUS(j->status) : -WTERMSIG(j->status);
  for (size_t k = 0; k < j->len; k++)
    if (j->buf[k] == '\n' || j->buf[k] == '\t') j->buf[k] = ' ';
  long long cpu_us = (long long)(j->ru.ru_utime.tv_sec + j->ru.ru_stime.tv_sec) * 1000000 + j->ru.ru_utime.tv_usec +
                     j->ru.ru_stime.tv_usec;
  printf("%s\t%d\t%lld\t%lld\t%.*s\n", j->id, code, (long long)((j->t1_ns - j->t0_ns) / 1000), cpu_us, (int)j->len,
         j->buf);
  fflush(stdout);
  free(j->buf);
  jobs[i] = jobs[--njobs];
}

int main(void) {
  static char line[1 << 20];
  size_t llen = 0;
  int eof = 0;
  signal(SIGPIPE, SIG_IGN);
  while (!eof || njobs > 0) {
    struct pollfd p[1 + 2 * MAX_JOBS];
    int np = 0;
    if (!eof) p[np++] = (struct pollfd){.fd = 0, .events = POLLIN};
    for (int i = 0; i < njobs; i++) {
      p[np++] = (struct pollfd){.fd = jobs[i].pidfd, .events = POLLIN};
      p[np++] = (struct pollfd){.fd = jobs[i].out, .events = POLLIN};
    }
    if (poll(p, (nfds_t)np, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    int64_t t = now_ns();
    int k = 0;
    if (!eof) {
      if (p[0].revents) {
        ssize_t n = read(0, line + llen, sizeof line - llen);
        if (n < 0 && errno != EINTR) die("read");
        if (n == 0) eof = 1;
        if (n > 0) {
          llen += (size_t)n;
          char *nl;
          while ((nl = memchr(line, '\n', llen)) != NULL) {
            *nl = '\0';
            size_t used = (size_t)(nl - line) + 1;
            start(line);
            memmove(line, line + used, llen - used);
            llen -= used;
          }
          if (llen == sizeof line) {
            fprintf(stderr, "mc-cni-exec: job line too long\n");
            exit(2);
          }
        }
      }
      k = 1;
    }
    /* the jobs polled are the first (np - k) / 2; start() may have added more */
    int polled = (np - k) / 2;
    for (int i = polled - 1; i >= 0; i--) {
      struct job *j = &jobs[i];
      if (j->pidfd >= 0 && p[k + 2 * i].revents) {
        j->t1_ns = t;
        if (wait4(j->pid, &j->status, 0, &j->ru) < 0) die("wait4");
        close(j->pidfd);
        j->pidfd = -1;
      }
      if (j->out >= 0 && p[k + 2 * i + 1].revents) {
        for (;;) {
          ssize_t n = read(j->out, j->buf + j->len, OUT_CAP - j->len);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0 || (j->len += (size_t)n) == OUT_CAP) {
            close(j->out);
            j->out = -1;
          }
          break;
        }
      }
      if (j->pidfd < 0 && j->out < 0) finish(i);
    }
  }
  return 0;
}
