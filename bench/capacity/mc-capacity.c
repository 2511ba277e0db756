// SPDX-License-Identifier: Apache-2.0
/*
 * mc-capacity: the C end of the connection-capacity bench (bench/capacity/main.ts).
 * Node cannot hold a hundred thousand sockets cheaply; one epoll thread can.
 *
 *   mc-capacity sink  --listen ADDR:PORT [--uid N] [--procs 8] [--expect A,B,..:PORT]
 *       Accepts and holds every connection; echoes what it reads (1 B in the
 *       churn test) and closes on EOF. With --expect it reads
 *       getsockopt(SO_ORIGINAL_DST, or IP6T_SO_ORIGINAL_DST for IPv6) on
 *       every accepted socket (as Envoy does) and counts answers that are
 *       one of the expected destinations.
 *
 * Addresses are IPv4 or IPv6 (all of one family); the port follows the last
 * ':' (ADDR may be bracketed: [::]:15001).
 *       --uid: drop to that uid/gid (the proxy) after binding.
 *       {"event":"ready"} once listening; {"event":"stats",...} on SIGUSR1.
 *
 *   mc-capacity hold  --dst A,B,..:PORT [--procs 16] [--window 256] [--timeout-ms 2000] [--max N] [--seconds S]
 *       Opens connections round-robin over the destinations (nonblocking,
 *       up to --window in flight) and keeps every one open, until each
 *       destination answered EADDRNOTAVAIL (its ephemeral ports are used up),
 *       or 1,000 connects failed otherwise (SYN dropped: timed out after
 *       --timeout-ms), or --max, or --seconds. Prints {"event":"result",...}
 *       and holds the sockets until SIGTERM (the driver reads ss meanwhile).
 *
 *   mc-capacity churn --dst A,B,..:PORT --seconds S [--conc 64] [--timeout-ms 2000]
 *       --conc connections at a time, each: connect, write 1 B, read the
 *       echo, close (the app closes first: TIME_WAIT is on its side). A slot
 *       whose connect() fails at once (EADDRNOTAVAIL: no port left) retries
 *       after 1 ms. Prints completed connections per second and the errors.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/netfilter_ipv4.h> /* SO_ORIGINAL_DST */
#ifndef IP6T_SO_ORIGINAL_DST
#define IP6T_SO_ORIGINAL_DST 80 /* linux/netfilter_ipv6/ip6_tables.h */
#endif
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_DST 64
#define MAX_FD (1 << 20)
#define NERR 140

union addr {
	struct sockaddr sa;
	struct sockaddr_in in;
	struct sockaddr_in6 in6;
};
static union addr dsts[MAX_DST];
static int ndst;

static socklen_t addr_len(const union addr *a)
{
	return a->sa.sa_family == AF_INET6 ? sizeof(a->in6) : sizeof(a->in);
}

/* "ADDR" or "[ADDR]" and a port (network order) -> a */
static int parse_addr(const char *text, uint16_t port, union addr *a)
{
	char host[INET6_ADDRSTRLEN + 2];
	size_t n = strlen(text);
	if (n >= sizeof(host))
		return -1;
	memcpy(host, text, n + 1);
	if (host[0] == '[' && n > 1 && host[n - 1] == ']') {
		host[n - 1] = 0;
		memmove(host, host + 1, n - 1);
	}
	memset(a, 0, sizeof(*a));
	if (inet_pton(AF_INET, host, &a->in.sin_addr) == 1) {
		a->in.sin_family = AF_INET;
		a->in.sin_port = port;
		return 0;
	}
	if (inet_pton(AF_INET6, host, &a->in6.sin6_addr) == 1) {
		a->in6.sin6_family = AF_INET6;
		a->in6.sin6_port = port;
		return 0;
	}
	return -1;
}

/* Same address and port (a v4 answer to a v4 destination, v6 to v6). */
static int same_addr(const union addr *x, const union addr *y)
{
	if (x->sa.sa_family != y->sa.sa_family)
		return 0;
	if (x->sa.sa_family == AF_INET)
		return x->in.sin_addr.s_addr == y->in.sin_addr.s_addr && x->in.sin_port == y->in.sin_port;
	return !memcmp(&x->in6.sin6_addr, &y->in6.sin6_addr, 16) && x->in6.sin6_port == y->in6.sin6_port;
}
static unsigned long long errs[NERR];

static void die(const char *what)
{
	fprintf(stderr, "mc-capacity: %s: %s\n", what, strerror(errno));
	exit(1);
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void count_err(int e)
{
	errs[e > 0 && e < NERR ? e : 0]++;
}

static void print_errs(void)
{
	int first = 1;
	printf("\"errors\":{");
	for (int e = 0; e < NERR; e++) {
		if (!errs[e])
			continue;
		printf("%s\"%s\":%llu", first ? "" : ",", e ? strerrorname_np(e) : "other", errs[e]);
		first = 0;
	}
	printf("}");
}

/* "A,B,C:PORT" -> dsts[] */
static void parse_dsts(const char *s)
{
	const char *colon = strrchr(s, ':');
	if (!colon) {
		fprintf(stderr, "mc-capacity: --dst/--expect wants A,B,..:PORT, got %s\n", s);
		exit(2);
	}
	uint16_t port = htons((uint16_t)atoi(colon + 1));
	char buf[4096];
	size_t n = (size_t)(colon - s);
	if (n >= sizeof(buf))
		exit(2);
	memcpy(buf, s, n);
	buf[n] = 0;
	for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
		if (ndst == MAX_DST) {
			fprintf(stderr, "mc-capacity: more than %d destinations\n", MAX_DST);
			exit(2);
		}
		union addr *a = &dsts[ndst++];
		if (parse_addr(tok, port, a) < 0 || a->sa.sa_family != dsts[0].sa.sa_family) {
			fprintf(stderr, "mc-capacity: not an IP address of the first one's family: %s\n", tok);
			exit(2);
		}
	}
}

static int signal_fd(void)
{
	sigset_t ss;
	sigemptyset(&ss);
	sigaddset(&ss, SIGTERM);
	sigaddset(&ss, SIGINT);
	sigaddset(&ss, SIGUSR1);
	sigprocmask(SIG_BLOCK, &ss, NULL);
	int fd = signalfd(-1, &ss, SFD_NONBLOCK | SFD_CLOEXEC);
	if (fd < 0)
		die("signalfd");
	return fd;
}

/*
 * Many processes, not one: the descriptor limit here is a hard 20,000 per
 * process and the bench has no CAP_SYS_RESOURCE to raise it, so sink and
 * hold fork --procs workers (each up to its soft limit, raised to the hard
 * one) and keep their counters in shared memory.
 */
static int nofile_cap(void)
{
	struct rlimit r;
	if (getrlimit(RLIMIT_NOFILE, &r) < 0)
		die("getrlimit");
	r.rlim_cur = r.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &r) < 0)
		die("setrlimit");
	return (int)(r.rlim_cur > MAX_FD ? MAX_FD : r.rlim_cur) - 64;
}

static void *shared(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		die("mmap");
	return p;
}

/* A worker: dies with its parent, and ignores the SIGUSR1 the driver sends the group. */
static pid_t workers[64];
static int nworkers;

static void spawned(pid_t p)
{
	if (p < 0)
		die("fork");
	workers[nworkers++] = p;
}

static void stop_workers(void)
{
	for (int i = 0; i < nworkers; i++)
		kill(workers[i], SIGKILL);
}

static void become_worker(void)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	signal(SIGUSR1, SIG_IGN);
}

#define ADD(x, n) __atomic_fetch_add(&(x), (n), __ATOMIC_RELAXED)

/* ------------------------------------------------------------------ sink */

#define MAX_PROCS 64
#define LOCALS 64
struct sink_shared {
	unsigned long long accepted, open_now, origdst_ok, origdst_bad, origdst_fail, accept_err;
	/* distinct local addresses of the accepted sockets (where the app's connect was sent), per worker */
	struct in6_addr locals[MAX_PROCS][LOCALS]; /* IPv4 v4-mapped */
	int nlocals[MAX_PROCS], more[MAX_PROCS];
};
static struct sink_shared *sh;

static void note_local(int w, int fd)
{
	union addr l;
	socklen_t ll = sizeof(l);
	struct in6_addr a = { 0 };
	if (getsockname(fd, &l.sa, &ll) < 0)
		return;
	if (l.sa.sa_family == AF_INET) {
		a.s6_addr[10] = a.s6_addr[11] = 0xff;
		memcpy(&a.s6_addr[12], &l.in.sin_addr, 4);
	} else {
		a = l.in6.sin6_addr;
	}
	for (int i = 0; i < sh->nlocals[w]; i++)
		if (!memcmp(&sh->locals[w][i], &a, 16))
			return;
	if (sh->nlocals[w] < LOCALS)
		sh->locals[w][sh->nlocals[w]++] = a;
	else
		sh->more[w] = 1;
}

static void sink_stats(int procs)
{
	static struct in6_addr all[MAX_PROCS * LOCALS];
	int n = 0, more = 0;
	for (int w = 0; w < procs; w++) {
		more |= sh->more[w];
		for (int i = 0; i < sh->nlocals[w]; i++) {
			int seen = 0;
			for (int j = 0; j < n; j++)
				seen |= !memcmp(&all[j], &sh->locals[w][i], 16);
			if (!seen)
				all[n++] = sh->locals[w][i];
		}
	}
	printf("{\"event\":\"stats\",\"accepted\":%llu,\"open\":%llu,\"origdst_ok\":%llu,\"origdst_bad\":%llu,"
	       "\"origdst_fail\":%llu,\"accept_errors\":%llu,\"local_addrs\":%d,\"local_addrs_more\":%s,\"local_sample\":[",
	       sh->accepted, sh->open_now, sh->origdst_ok, sh->origdst_bad, sh->origdst_fail, sh->accept_err, n, more ? "true" : "false");
	for (int i = 0; i < n && i < 16; i++) {
		char b[INET6_ADDRSTRLEN];
		if (IN6_IS_ADDR_V4MAPPED(&all[i]))
			inet_ntop(AF_INET, &all[i].s6_addr[12], b, sizeof(b));
		else
			inet_ntop(AF_INET6, &all[i], b, sizeof(b));
		printf("%s\"%s\"", i ? "," : "", b);
	}
	printf("]}\n");
	fflush(stdout);
}

static void sink_worker(int w, int lfd, int expect, int cap)
{
	int ep = epoll_create1(EPOLL_CLOEXEC), listening = 1;
	long open_here = 0;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE, .data.fd = lfd };
	if (epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) < 0)
		die("epoll_ctl ADD listener");
	struct epoll_event evs[256];
	for (;;) {
		int n = epoll_wait(ep, evs, 256, -1);
		for (int i = 0; i < n; i++) {
			int fd = evs[i].data.fd;
			if (fd == lfd) {
				while (open_here < cap) {
					int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
					if (c < 0) {
						if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
							ADD(sh->accept_err, 1);
						break;
					}
					ADD(sh->accepted, 1);
					ADD(sh->open_now, 1);
					open_here++;
					if (expect) {
						union addr o;
						socklen_t ol = sizeof(o);
						int v6 = dsts[0].sa.sa_family == AF_INET6;
						memset(&o, 0, sizeof(o));
						if (getsockopt(c, v6 ? SOL_IPV6 : SOL_IP, v6 ? IP6T_SO_ORIGINAL_DST : SO_ORIGINAL_DST, &o, &ol) < 0) {
							ADD(sh->origdst_fail, 1);
						} else {
							int hit = 0;
							for (int d = 0; d < ndst; d++)
								hit |= same_addr(&o, &dsts[d]);
							hit ? ADD(sh->origdst_ok, 1) : ADD(sh->origdst_bad, 1);
						}
					}
					note_local(w, c);
					struct epoll_event cev = { .events = EPOLLIN | EPOLLRDHUP, .data.fd = c };
					if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev) < 0)
						die("epoll_ctl ADD");
				}
				if (open_here >= cap && listening) {
					/* full: the other workers take the next ones */
					epoll_ctl(ep, EPOLL_CTL_DEL, lfd, NULL);
					listening = 0;
				}
				continue;
			}
			char buf[512];
			ssize_t r = read(fd, buf, sizeof(buf));
			if (r > 0) {
				if (write(fd, buf, (size_t)r) < 0) { /* a 1 B echo: the buffer has room */
				}
				continue;
			}
			if (r < 0 && errno == EAGAIN)
				continue;
			close(fd);
			ADD(sh->open_now, -1ULL);
			open_here--;
			if (!listening && open_here < cap) {
				epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
				listening = 1;
			}
		}
	}
}

static int sink(int argc, char **argv)
{
	const char *listen_at = NULL;
	int uid = -1, expect = 0, procs = 8;
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--listen") && i + 1 < argc)
			listen_at = argv[++i];
		else if (!strcmp(argv[i], "--uid") && i + 1 < argc)
			uid = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--procs") && i + 1 < argc)
			procs = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--expect") && i + 1 < argc) {
			parse_dsts(argv[++i]);
			expect = 1;
		} else {
			fprintf(stderr, "usage: mc-capacity sink --listen ADDR:PORT [--uid N] [--procs N] [--expect A,B:PORT]\n");
			return 2;
		}
	}
	if (!listen_at || procs < 1 || procs > MAX_PROCS)
		return fprintf(stderr, "mc-capacity sink: --listen is required, --procs 1..%d\n", MAX_PROCS), 2;
	union addr a;
	{
		char host[64];
		const char *colon = strrchr(listen_at, ':');
		if (!colon || (size_t)(colon - listen_at) >= sizeof(host))
			return fprintf(stderr, "mc-capacity sink: --listen wants ADDR:PORT\n"), 2;
		memcpy(host, listen_at, (size_t)(colon - listen_at));
		host[colon - listen_at] = 0;
		if (parse_addr(host, htons((uint16_t)atoi(colon + 1)), &a) < 0)
			return fprintf(stderr, "mc-capacity sink: not an IP address: %s\n", host), 2;
	}
	int cap = nofile_cap();
	if (uid >= 0) {
		if (setgroups(0, NULL) < 0 || setgid((gid_t)uid) < 0 || setuid((uid_t)uid) < 0)
			die("dropping to the proxy uid");
	}
	sh = shared(sizeof(*sh));
	int lfd = socket(a.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
	if (lfd < 0)
		die("socket");
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(lfd, &a.sa, addr_len(&a)) < 0)
		die(listen_at);
	if (listen(lfd, 65535) < 0)
		die("listen");
	for (int w = 0; w < procs; w++) {
		pid_t p = fork();
		if (p == 0) {
			become_worker();
			sink_worker(w, lfd, expect, cap);
			_exit(0);
		}
		spawned(p);
	}
	int sfd = signal_fd();
	printf("{\"event\":\"ready\",\"listen\":\"%s\",\"uid\":%d,\"procs\":%d,\"fdsPerProc\":%d}\n", listen_at, (int)getuid(), procs, cap);
	fflush(stdout);
	for (;;) {
		struct signalfd_siginfo si;
		if (read(sfd, &si, sizeof(si)) != sizeof(si)) {
			struct pollfd pf = { .fd = sfd, .events = POLLIN };
			poll(&pf, 1, -1);
			continue;
		}
		sink_stats(procs);
		if (si.ssi_signo != SIGUSR1) {
			stop_workers();
			return 0;
		}
	}
}

/* ------------------------------------------------------------------ hold */

struct hold_shared {
	long established[MAX_PROCS], failed[MAX_PROCS], per_dst[MAX_PROCS][MAX_DST];
	double t_last_ok[MAX_PROCS];
	int exhausted[MAX_PROCS], capped[MAX_PROCS], done[MAX_PROCS];
	unsigned long long errs[MAX_PROCS][NERR];
};
static struct hold_shared *hs;

static void hold_worker(int w, int window, int timeout_ms, long max, double seconds, double t0, int cap)
{
	double *started = calloc(MAX_FD, sizeof(*started)); /* per fd: connect start (0 = not in flight) */
	int *flight = calloc((size_t)window, sizeof(int)), nflight = 0;
	int *dst_of = calloc(MAX_FD, sizeof(int));
	if (!started || !flight || !dst_of)
		die("calloc");
	int notavail[MAX_DST] = { 0 }, active = ndst, next = w % ndst;
	long established = 0, failed = 0;
	int ep = epoll_create1(EPOLL_CLOEXEC);
	double last_scan = now_s();
	struct epoll_event evs[256];
#define ERR(e) (hs->errs[w][(e) > 0 && (e) < NERR ? (e) : 0]++)

	while (established < max && established + nflight < cap && now_s() - t0 < seconds) {
		while (nflight < window && active > 0 && established + nflight < max && established + nflight < cap && failed < 1000) {
			while (notavail[next] >= 3)
				next = (next + 1) % ndst;
			int d = next;
			next = (next + 1) % ndst;
			int fd = socket(dsts[d].sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
			if (fd < 0)
				die("socket");
			if (connect(fd, &dsts[d].sa, addr_len(&dsts[d])) == 0) {
				established++, hs->per_dst[w][d]++, hs->t_last_ok[w] = now_s() - t0;
				continue;
			}
			if (errno == EINPROGRESS) {
				struct epoll_event ev = { .events = EPOLLOUT, .data.fd = fd };
				epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
				started[fd] = now_s();
				dst_of[fd] = d;
				flight[nflight++] = fd;
				continue;
			}
			ERR(errno);
			if (errno == EADDRNOTAVAIL) {
				/* this destination's ports (or, through one loopback tuple, everyone's) are used up */
				if (++notavail[d] == 3)
					active--;
			} else {
				failed++;
			}
			close(fd);
		}
		if (nflight == 0 && (active == 0 || failed >= 1000))
			break;
		int n = epoll_wait(ep, evs, 256, 10);
		for (int i = 0; i < n; i++) {
			int fd = evs[i].data.fd, e = 0;
			socklen_t el = sizeof(e);
			getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
			epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
			started[fd] = 0;
			if (e == 0) {
				established++, hs->per_dst[w][dst_of[fd]]++, hs->t_last_ok[w] = now_s() - t0;
			} else {
				ERR(e), failed++;
				close(fd);
			}
		}
		double t = now_s();
		if (n > 0 || t - last_scan > 0.1) {
			/* compact the in-flight list; time out connects whose SYNs go unanswered */
			int k = 0;
			for (int i = 0; i < nflight; i++) {
				int fd = flight[i];
				if (started[fd] == 0)
					continue;
				if ((t - started[fd]) * 1000 > timeout_ms) {
					epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
					started[fd] = 0;
					close(fd);
					ERR(ETIMEDOUT), failed++;
					continue;
				}
				flight[k++] = fd;
			}
			nflight = k;
			last_scan = t;
		}
		hs->established[w] = established;
	}
	hs->established[w] = established;
	hs->failed[w] = failed;
	hs->exhausted[w] = ndst - active;
	hs->capped[w] = established + nflight >= cap;
	__atomic_store_n(&hs->done[w], 1, __ATOMIC_RELEASE);
	for (;;)
		pause(); /* hold every socket until the parent goes */
}

static int hold(int argc, char **argv)
{
	int window = 256, timeout_ms = 2000, procs = 16;
	long max = 10000000;
	double seconds = 120;
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--dst") && i + 1 < argc)
			parse_dsts(argv[++i]);
		else if (!strcmp(argv[i], "--window") && i + 1 < argc)
			window = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--timeout-ms") && i + 1 < argc)
			timeout_ms = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--max") && i + 1 < argc)
			max = atol(argv[++i]);
		else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			seconds = atof(argv[++i]);
		else if (!strcmp(argv[i], "--procs") && i + 1 < argc)
			procs = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: mc-capacity hold --dst A,B:PORT [--window N] [--timeout-ms N] [--max N] [--seconds S] [--procs N]\n");
			return 2;
		}
	}
	if (!ndst || procs < 1 || procs > MAX_PROCS || window < procs)
		return fprintf(stderr, "mc-capacity hold: --dst is required, --procs 1..%d, --window >= --procs\n", MAX_PROCS), 2;
	int cap = nofile_cap();
	hs = shared(sizeof(*hs));
	double t0 = now_s();
	for (int w = 0; w < procs; w++) {
		pid_t p = fork();
		if (p == 0) {
			become_worker();
			hold_worker(w, window / procs, timeout_ms, max / procs, seconds, t0, cap);
			_exit(0);
		}
		spawned(p);
	}
	int sfd = signal_fd();
	long curve[1200];
	int ncurve = 0;
	double next_sample = t0 + 1;
	for (;;) {
		if (now_s() >= next_sample && ncurve < 1200) {
			long sum = 0;
			for (int w = 0; w < procs; w++)
				sum += __atomic_load_n(&hs->established[w], __ATOMIC_RELAXED);
			curve[ncurve++] = sum;
			next_sample += 1;
		}
		int all = 1;
		for (int w = 0; w < procs; w++)
			all &= __atomic_load_n(&hs->done[w], __ATOMIC_ACQUIRE);
		if (all)
			break;
		struct signalfd_siginfo si;
		if (read(sfd, &si, sizeof(si)) == sizeof(si) && si.ssi_signo != SIGUSR1) {
			stop_workers();
			return 1;
		}
		usleep(50000);
	}
	long est = 0, failed = 0, per_dst[MAX_DST] = { 0 };
	int exhausted = 0, capped = 0;
	double last = 0;
	for (int w = 0; w < procs; w++) {
		est += hs->established[w], failed += hs->failed[w];
		exhausted = hs->exhausted[w] > exhausted ? hs->exhausted[w] : exhausted;
		capped += hs->capped[w];
		last = hs->t_last_ok[w] > last ? hs->t_last_ok[w] : last;
		for (int d = 0; d < ndst; d++)
			per_dst[d] += hs->per_dst[w][d];
		for (int e = 0; e < NERR; e++)
			errs[e] += hs->errs[w][e];
	}
	printf("{\"event\":\"result\",\"established\":%ld,\"failed\":%ld,\"seconds\":%.2f,\"secondsToLast\":%.2f,\"procs\":%d,\"fdsPerProc\":%d,\"procsAtFdLimit\":%d,\"perDst\":[",
	       est, failed, now_s() - t0, last, procs, cap, capped);
	for (int d = 0; d < ndst; d++)
		printf("%s%ld", d ? "," : "", per_dst[d]);
	printf("],\"exhausted\":%d,\"establishedBySecond\":[", exhausted);
	for (int i = 0; i < ncurve; i++)
		printf("%s%ld", i ? "," : "", curve[i]);
	printf("],");
	print_errs();
	printf("}\n");
	fflush(stdout);
	/* the workers hold every socket until told to stop */
	for (;;) {
		struct signalfd_siginfo si;
		struct pollfd pf = { .fd = sfd, .events = POLLIN };
		poll(&pf, 1, -1);
		if (read(sfd, &si, sizeof(si)) == sizeof(si) && si.ssi_signo != SIGUSR1) {
			stop_workers();
			return 0;
		}
	}
}

/* ------------------------------------------------------------------ churn */

enum { S_IDLE, S_CONNECT, S_READ, S_BACKOFF };
struct slot {
	int fd, state;
	double t;
};

static int churn(int argc, char **argv)
{
	int conc = 64, timeout_ms = 2000;
	double seconds = 10;
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--dst") && i + 1 < argc)
			parse_dsts(argv[++i]);
		else if (!strcmp(argv[i], "--conc") && i + 1 < argc)
			conc = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--timeout-ms") && i + 1 < argc)
			timeout_ms = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			seconds = atof(argv[++i]);
		else {
			fprintf(stderr, "usage: mc-capacity churn --dst A,B:PORT --seconds S [--conc N] [--timeout-ms N]\n");
			return 2;
		}
	}
	if (!ndst || conc < 1 || conc > 4096 || seconds <= 0 || seconds > 600)
		return fprintf(stderr, "mc-capacity churn: --dst, --conc 1..4096 and --seconds 0..600 are required\n"), 2;
	nofile_cap();
	struct slot *s = calloc((size_t)conc, sizeof(*s));
	int nsec = (int)seconds + 1;
	unsigned long long *per_sec = calloc((size_t)nsec + 1, sizeof(*per_sec)), *fail_sec = calloc((size_t)nsec + 1, sizeof(*fail_sec));
	if (!s || !per_sec || !fail_sec)
		die("calloc");
	int ep = epoll_create1(EPOLL_CLOEXEC), next = 0;
	unsigned long long ok = 0;
	double t0 = now_s(), end = t0 + seconds;
	struct epoll_event evs[256];

	for (double t = now_s(); t < end; t = now_s()) {
		int sec = (int)(t - t0);
		for (int i = 0; i < conc; i++) {
			struct slot *c = &s[i];
			if (c->state == S_BACKOFF && t < c->t)
				continue;
			if (c->state == S_CONNECT || c->state == S_READ) {
				if ((t - c->t) * 1000 > timeout_ms) {
					close(c->fd);
					count_err(ETIMEDOUT), fail_sec[sec]++;
					c->state = S_IDLE;
				} else {
					continue;
				}
			}
			union addr *d = &dsts[next];
			int fd = socket(d->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
			if (fd < 0)
				die("socket");
			next = (next + 1) % ndst;
			if (connect(fd, &d->sa, addr_len(d)) < 0 && errno != EINPROGRESS) {
				count_err(errno), fail_sec[sec]++;
				close(fd);
				c->state = S_BACKOFF;
				c->t = t + 0.001;
				continue;
			}
			c->fd = fd;
			c->state = S_CONNECT;
			c->t = t;
			struct epoll_event ev = { .events = EPOLLOUT, .data.u32 = (uint32_t)i };
			epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
		}
		int n = epoll_wait(ep, evs, 256, 1);
		t = now_s();
		sec = (int)(t - t0);
		if (sec > nsec)
			sec = nsec;
		for (int k = 0; k < n; k++) {
			struct slot *c = &s[evs[k].data.u32];
			if (c->state == S_CONNECT) {
				int e = 0;
				socklen_t el = sizeof(e);
				getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &el);
				if (e == 0 && write(c->fd, "x", 1) == 1) {
					struct epoll_event ev = { .events = EPOLLIN, .data.u32 = evs[k].data.u32 };
					epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
					c->state = S_READ;
					continue;
				}
				count_err(e ? e : errno), fail_sec[sec]++;
			} else if (c->state == S_READ) {
				char b;
				ssize_t r = read(c->fd, &b, 1);
				if (r < 0 && errno == EAGAIN)
					continue;
				if (r == 1)
					ok++, per_sec[sec]++;
				else
					count_err(r == 0 ? ECONNRESET : errno), fail_sec[sec]++;
			} else {
				continue;
			}
			close(c->fd); /* the app closes first: TIME_WAIT stays on its side */
			c->state = S_IDLE;
		}
	}
	double el = now_s() - t0;
	printf("{\"event\":\"result\",\"completed\":%llu,\"seconds\":%.2f,\"perSecond\":[", ok, el);
	for (int i = 0; i < (int)seconds; i++)
		printf("%s%llu", i ? "," : "", per_sec[i]);
	printf("],\"failedPerSecond\":[");
	for (int i = 0; i < (int)seconds; i++)
		printf("%s%llu", i ? "," : "", fail_sec[i]);
	printf("],");
	print_errs();
	printf("}\n");
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "sink"))
		return sink(argc - 2, argv + 2);
	if (argc >= 2 && !strcmp(argv[1], "hold"))
		return hold(argc - 2, argv + 2);
	if (argc >= 2 && !strcmp(argv[1], "churn"))
		return churn(argc - 2, argv + 2);
	fprintf(stderr, "usage: mc-capacity sink|hold|churn ... (see the comment at the top of mc-capacity.c)\n");
	return 2;
}
