// SPDX-License-Identifier: Apache-2.0
/*
 * mc-bench-echo: the echo end of the datapath benchmark (scripts/bench-datapath.mjs).
 *
 * One thread, epoll, level-triggered: every byte read is written back. Used
 * twice: as the "proxy" of the app-to-proxy leg (with --origdst it calls
 * getsockopt(SO_ORIGINAL_DST) on every accepted socket, as Envoy's
 * original_dst listener filter does, so each mode pays for recovering the
 * destination) and as the remote service at the end of the whole path.
 * accept4() asks for the peer's address, as Envoy's and HAProxy's do, so
 * each mode pays what its getpeername view costs there.
 *
 *   mc-bench-echo --listen 0.0.0.0:15001 [--origdst]
 *
 * Prints {"event":"ready",...} once listening, {"event":"stats",...} on
 * SIGUSR1 and on SIGTERM/SIGINT (then exits 0).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter_ipv4.h> /* SO_ORIGINAL_DST */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUF (64 * 1024)

struct conn {
	int fd;
	size_t off, len; /* bytes read but not yet written back */
	char buf[BUF];
};

static unsigned long long accepted, origdst_ok, origdst_fail;
static int ep;

static void die(const char *what)
{
	fprintf(stderr, "mc-bench-echo: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void stats(void)
{
	printf("{\"event\":\"stats\",\"accepted\":%llu,\"origdst_ok\":%llu,\"origdst_fail\":%llu}\n", accepted, origdst_ok, origdst_fail);
	fflush(stdout);
}

static void drop(struct conn *c)
{
	close(c->fd); /* also removes it from the epoll set */
	free(c);
}

static void want(struct conn *c, uint32_t events)
{
	struct epoll_event ev = { .events = events, .data.ptr = c };
	if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0)
		die("epoll_ctl MOD");
}

/* Write back what is pending; returns 0 when all of it went out. */
static int flush(struct conn *c)
{
	while (c->off < c->len) {
		ssize_t n = write(c->fd, c->buf + c->off, c->len - c->off);
		if (n < 0)
			return errno == EAGAIN ? 1 : -1;
		c->off += (size_t)n;
	}
	c->off = c->len = 0;
	return 0;
}

static void on_conn(struct conn *c, uint32_t events)
{
	if (c->len) { /* waiting for room to write */
		int r = flush(c);
		if (r < 0)
			return drop(c);
		if (r == 0)
			want(c, EPOLLIN);
		return;
	}
	if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
		return;
	ssize_t n = read(c->fd, c->buf, BUF);
	if (n == 0 || (n < 0 && errno != EAGAIN))
		return drop(c);
	if (n < 0)
		return;
	c->len = (size_t)n;
	int r = flush(c);
	if (r < 0)
		return drop(c);
	if (r > 0) /* the peer is slow to read: stop reading until our bytes are out */
		want(c, EPOLLOUT);
}

static void on_accept(int lfd, int origdst)
{
	for (;;) {
		struct sockaddr_storage peer;
		socklen_t pl = sizeof(peer);
		int fd = accept4(lfd, (struct sockaddr *)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EAGAIN || errno == ECONNABORTED || errno == EINTR)
				return;
			die("accept4");
		}
		accepted++;
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (origdst) {
			struct sockaddr_in o;
			socklen_t ol = sizeof(o);
			if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &o, &ol) == 0)
				origdst_ok++;
			else
				origdst_fail++;
		}
		struct conn *c = malloc(sizeof(*c));
		if (!c)
			die("malloc");
		c->fd = fd;
		c->off = c->len = 0;
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
		if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
			die("epoll_ctl ADD");
	}
}

int main(int argc, char **argv)
{
	const char *listen_at = NULL;
	int origdst = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--listen") && i + 1 < argc)
			listen_at = argv[++i];
		else if (!strcmp(argv[i], "--origdst"))
			origdst = 1;
		else {
			fprintf(stderr, "usage: mc-bench-echo --listen ADDR:PORT [--origdst]\n");
			return 2;
		}
	}
	if (!listen_at) {
		fprintf(stderr, "mc-bench-echo: --listen ADDR:PORT is required\n");
		return 2;
	}
	char host[64];
	const char *colon = strrchr(listen_at, ':');
	if (!colon || (size_t)(colon - listen_at) >= sizeof(host)) {
		fprintf(stderr, "mc-bench-echo: --listen wants IPv4ADDR:PORT, got %s\n", listen_at);
		return 2;
	}
	memcpy(host, listen_at, (size_t)(colon - listen_at));
	host[colon - listen_at] = 0;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1)) };
	if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
		fprintf(stderr, "mc-bench-echo: not an IPv4 address: %s\n", host);
		return 2;
	}

	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int one = 1;
	if (lfd < 0)
		die("socket");
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0)
		die(listen_at);
	if (listen(lfd, 4096) < 0)
		die("listen");

	sigset_t ss;
	sigemptyset(&ss);
	sigaddset(&ss, SIGTERM);
	sigaddset(&ss, SIGINT);
	sigaddset(&ss, SIGUSR1);
	sigprocmask(SIG_BLOCK, &ss, NULL);
	signal(SIGPIPE, SIG_IGN);
	int sfd = signalfd(-1, &ss, SFD_CLOEXEC);
	if (sfd < 0)
		die("signalfd");

	ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0)
		die("epoll_create1");
	/* The two fixed fds are told apart from connections by their tagged pointers. */
	static int lfd_tag, sfd_tag;
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &lfd_tag };
	epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
	ev.data.ptr = &sfd_tag;
	epoll_ctl(ep, EPOLL_CTL_ADD, sfd, &ev);

	printf("{\"event\":\"ready\",\"listen\":\"%s\",\"origdst\":%s,\"pid\":%d}\n", listen_at, origdst ? "true" : "false", getpid());
	fflush(stdout);

	struct epoll_event evs[64];
	for (;;) {
		int n = epoll_wait(ep, evs, 64, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("epoll_wait");
		}
		for (int i = 0; i < n; i++) {
			void *p = evs[i].data.ptr;
			if (p == &lfd_tag) {
				on_accept(lfd, origdst);
			} else if (p == &sfd_tag) {
				struct signalfd_siginfo si;
				if (read(sfd, &si, sizeof(si)) != sizeof(si))
					continue;
				stats();
				if (si.ssi_signo != SIGUSR1)
					return 0;
			} else {
				on_conn(p, evs[i].events);
			}
		}
	}
}
