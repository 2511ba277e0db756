// SPDX-License-Identifier: Apache-2.0
/*
 * mc-order-check: does a connection's byte stream reach the sidecar intact and
 * in order? The regression test for issue 20 (the sk_msg splice reordered
 * bytes that an app wrote before the proxy accepted its connection) runs it
 * as both ends inside a meshed pod's netns (test/privileged/datapath/byte-order.test.ts).
 *
 *   mc-order-check app --connect IPv4:PORT [--threads 32] [--conns 10000] [--chunks 64] [--confirm-ms 60000]
 *   mc-order-check sidecar --listen IPv4:PORT [--backlog 8] [--chunks 64]
 *                  [--accept-delay-us N] [--stall-ms S --stall-every K]
 *
 * app: THREADS threads open CONNS connections in total; on each, CHUNKS
 * numbered 16-byte chunks are written right after connect() returns, one
 * write() each (the window where the proxy has not accepted yet is exactly
 * what the test is about), then the app shuts its side down and waits for
 * the sidecar's end of the connection: EOF (the sidecar read it to its end:
 * "confirmed"), a reset (the listener refused the connection: "reset"), or
 * nothing within --confirm-ms ("unconfirmed": bytes that never reached the
 * sidecar whole). So every connection the app made is accounted for by the
 * app itself; a count of resets on the wire could not say which connection
 * each belonged to. Prints one JSON line.
 *
 * sidecar: listen(BACKLOG), accept (optionally slowly: a delay before every
 * accept, or a stall of S ms after every K accepts, to keep the accept queue
 * full), read every connection to EOF and check each chunk is the one expected
 * at its position. Prints {"event":"ready"} once listening. A number N on
 * stdin (the app's count of connections made) means: finish once N
 * connections have been read to their end, or after 5 s (--quiet-ms) without
 * a new connection or a finished one, or 60 s at most. An app's connect() can
 * return while its handshake is still stuck behind the full accept queue
 * (the listener dropped the final ACK: those complete late, on retransmits),
 * and some of those the listener never completes at all: with SYN cookies it
 * answers a late ACK whose cookie fails with a reset (TcpExtSyncookiesFailed,
 * plain TCP without meshcap does it too), after the app has closed. Then, or
 * on SIGTERM, it prints one JSON summary line and exits 0; "unfinished" lists
 * up to 8 connections still open then, each with what it read and its
 * TCP_INFO (state, segments and bytes in, ms since the last data), so a
 * failure says whether the peer stalled, went away or never sent its FIN.
 * "open_empty" counts those that never delivered a byte: with SYN cookies
 * forced the listener has made such sockets from segments without data,
 * with no app connection behind them (the app's own accounting says so).
 *
 * Chunk i of a connection: magic "MCOC", connection id, i, and
 * id * 2654435761 ^ i (so a chunk from another connection, or a torn chunk,
 * is caught as well as a moved one). All little-endian u32.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/tcp.h> /* the full struct tcp_info (glibc's is older) */
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define CHUNK 16
#define MAGIC 0x434f434du /* "MCOC" */
#define MAX_CHUNKS 4096

static unsigned chunks = 64;

static void die(const char *what)
{
	fprintf(stderr, "mc-order-check: %s: %s\n", what, strerror(errno));
	exit(1);
}

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void parse_addr(const char *s, struct sockaddr_in *a)
{
	char host[64];
	const char *colon = strrchr(s, ':');
	if (!colon || (size_t)(colon - s) >= sizeof(host)) {
		fprintf(stderr, "mc-order-check: want IPv4ADDR:PORT, got %s\n", s);
		exit(2);
	}
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = 0;
	memset(a, 0, sizeof(*a));
	a->sin_family = AF_INET;
	a->sin_port = htons((uint16_t)atoi(colon + 1));
	if (inet_pton(AF_INET, host, &a->sin_addr) != 1) {
		fprintf(stderr, "mc-order-check: not an IPv4 address: %s\n", host);
		exit(2);
	}
}

static void put32(unsigned char *p, uint32_t v)
{
	p[0] = v & 0xff;
	p[1] = (v >> 8) & 0xff;
	p[2] = (v >> 16) & 0xff;
	p[3] = v >> 24;
}

static uint32_t get32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void make_chunk(unsigned char *c, uint32_t id, uint32_t i)
{
	put32(c, MAGIC);
	put32(c + 4, id);
	put32(c + 8, i);
	put32(c + 12, id * 2654435761u ^ i);
}

/* ------------------------------------------------------------------ app */

static struct sockaddr_in dst;
static unsigned threads = 32, conns = 10000, confirm_ms = 60000;
static atomic_uint next_conn;
static atomic_ulong connected, connect_errors, write_errors, short_writes;
static atomic_ulong confirmed, resets, unconfirmed, unexpected;
static atomic_int first_errno;

static void note_errno(int e)
{
	int zero = 0;
	atomic_compare_exchange_strong(&first_errno, &zero, e);
}

/* After the last write: the sidecar's EOF once it has read the connection
 * to its end, or the listener's reset, or neither within confirm_ms. */
static void confirm(int fd)
{
	struct timeval rt = { .tv_sec = confirm_ms / 1000, .tv_usec = (confirm_ms % 1000) * 1000 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof(rt));
	if (shutdown(fd, SHUT_WR) < 0) {
		note_errno(errno);
		atomic_fetch_add(errno == ENOTCONN || errno == ECONNRESET ? &resets : &unexpected, 1);
		return;
	}
	char b[64];
	for (;;) {
		ssize_t n = read(fd, b, sizeof(b));
		if (n == 0) {
			atomic_fetch_add(&confirmed, 1);
			return;
		}
		if (n > 0) { /* the sidecar never writes */
			atomic_fetch_add(&unexpected, 1);
			return;
		}
		if (errno == EINTR)
			continue;
		if (errno == ECONNRESET || errno == EPIPE) {
			atomic_fetch_add(&resets, 1);
		} else if (errno == EAGAIN || errno == EWOULDBLOCK) {
			atomic_fetch_add(&unconfirmed, 1);
		} else {
			note_errno(errno);
			atomic_fetch_add(&unexpected, 1);
		}
		return;
	}
}

static void *app_thread(void *arg)
{
	(void)arg;
	unsigned char c[CHUNK];
	/* A bounded wait for a connect or write that the kernel holds up (backlog
	 * full: SYN retransmits); the run must end even if the datapath breaks. */
	struct timeval tmo = { .tv_sec = 10 };
	for (;;) {
		unsigned id = atomic_fetch_add(&next_conn, 1);
		if (id >= conns)
			return NULL;
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			die("socket");
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tmo, sizeof(tmo));
		if (connect(fd, (struct sockaddr *)&dst, sizeof(dst)) < 0) {
			note_errno(errno);
			atomic_fetch_add(&connect_errors, 1);
			close(fd);
			continue;
		}
		atomic_fetch_add(&connected, 1);
		int failed = 0;
		for (unsigned i = 0; i < chunks && !failed; i++) {
			make_chunk(c, id, i);
			ssize_t n = write(fd, c, CHUNK);
			if (n < 0) {
				note_errno(errno);
				atomic_fetch_add(&write_errors, 1);
				failed = errno;
			} else if (n != CHUNK) { /* a stream may take part of a write; the rest would still be in order */
				atomic_fetch_add(&short_writes, 1);
				failed = -1;
			}
		}
		if (failed == ECONNRESET || failed == EPIPE)
			atomic_fetch_add(&resets, 1);
		else if (!failed)
			confirm(fd);
		close(fd);
	}
}

static int app_main(void)
{
	pthread_t *t = calloc(threads, sizeof(*t));
	if (!t)
		die("calloc");
	signal(SIGPIPE, SIG_IGN);
	double t0 = now_ms();
	for (unsigned i = 0; i < threads; i++)
		if (pthread_create(&t[i], NULL, app_thread, NULL))
			die("pthread_create");
	for (unsigned i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	int e = atomic_load(&first_errno);
	printf("{\"mode\":\"app\",\"attempted\":%u,\"connected\":%lu,\"connect_errors\":%lu,\"write_errors\":%lu,\"short_writes\":%lu,"
	       "\"confirmed\":%lu,\"reset\":%lu,\"unconfirmed\":%lu,\"unexpected\":%lu,\"first_error\":\"%s\",\"ms\":%.0f}\n",
	       conns, atomic_load(&connected), atomic_load(&connect_errors), atomic_load(&write_errors), atomic_load(&short_writes),
	       atomic_load(&confirmed), atomic_load(&resets), atomic_load(&unconfirmed), atomic_load(&unexpected),
	       e ? strerror(e) : "", now_ms() - t0);
	return 0;
}

/* -------------------------------------------------------------- sidecar */

struct conn {
	struct conn *prev, *next; /* the open ones, for the summary */
	int fd;
	size_t len;
	double accepted_ms;
	int bad; /* a chunk out of place was seen */
	unsigned char buf[]; /* chunks * CHUNK + 1: one byte more than was sent shows a long stream */
};

static unsigned long long accepted, ok, reordered, shortc, errors, longc;
static long long example = -1; /* first reordered connection: position and what was there */
static unsigned example_pos, example_got;
static struct conn open_list = { .prev = &open_list, .next = &open_list };

/* Which position does chunk c claim, given the connection id of chunk 0? -1: garbage. */
static long chunk_index(const unsigned char *c)
{
	if (get32(c) != MAGIC)
		return -1;
	uint32_t id = get32(c + 4), i = get32(c + 8);
	if (get32(c + 12) != (id * 2654435761u ^ i))
		return -1;
	return i;
}

static void finish(struct conn *c, int err)
{
	size_t want = (size_t)chunks * CHUNK;
	/* Check every whole chunk that arrived: its index must be its position
	 * and every chunk must belong to the same connection. */
	size_t whole = c->len / CHUNK;
	uint32_t id0 = whole ? get32(c->buf + 4) : 0;
	for (size_t p = 0; p < whole && !c->bad; p++) {
		long i = chunk_index(c->buf + p * CHUNK);
		if (i != (long)p || get32(c->buf + p * CHUNK + 4) != id0) {
			c->bad = 1;
			if (example < 0) {
				example = id0;
				example_pos = p;
				example_got = (unsigned)i;
			}
		}
	}
	if (c->bad)
		reordered++;
	else if (err)
		errors++;
	else if (c->len > want)
		longc++;
	else if (c->len < want)
		shortc++;
	else
		ok++;
	c->prev->next = c->next;
	c->next->prev = c->prev;
	close(c->fd);
	free(c);
}

static void on_readable(struct conn *c)
{
	for (;;) {
		size_t cap = (size_t)chunks * CHUNK + 1;
		ssize_t n = read(c->fd, c->buf + c->len, cap - c->len);
		if (n > 0) {
			c->len += (size_t)n;
			if (c->len == cap) /* more than was ever sent: count it, stop reading */
				return finish(c, 0);
			continue;
		}
		if (n == 0)
			return finish(c, 0);
		if (errno == EAGAIN || errno == EINTR)
			return;
		return finish(c, errno);
	}
}

static int sidecar_main(const char *listen_at, int backlog, unsigned accept_delay_us, unsigned stall_ms, unsigned stall_every, unsigned quiet_ms)
{
	struct sockaddr_in a;
	parse_addr(listen_at, &a);
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int one = 1;
	if (lfd < 0)
		die("socket");
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0)
		die(listen_at);
	if (listen(lfd, backlog) < 0)
		die("listen");

	sigset_t ss;
	sigemptyset(&ss);
	sigaddset(&ss, SIGTERM);
	sigaddset(&ss, SIGINT);
	sigprocmask(SIG_BLOCK, &ss, NULL);
	int sfd = signalfd(-1, &ss, SFD_CLOEXEC);
	if (sfd < 0)
		die("signalfd");
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0)
		die("epoll_create1");
	static int lfd_tag, sfd_tag, in_tag;
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &lfd_tag };
	epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
	ev.data.ptr = &sfd_tag;
	epoll_ctl(ep, EPOLL_CTL_ADD, sfd, &ev);
	ev.data.ptr = &in_tag;
	epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev);
	char inbuf[64];
	size_t inlen = 0;

	printf("{\"event\":\"ready\",\"listen\":\"%s\",\"backlog\":%d,\"pid\":%d}\n", listen_at, backlog, getpid());
	fflush(stdout);

	long long expect = -1; /* from stdin */
	double expect_at = 0, last_activity = now_ms();
	int stop = 0;
	struct epoll_event evs[256];
	while (!stop) {
		unsigned long long done = ok + reordered + shortc + errors + longc;
		double t = now_ms();
		if (expect >= 0 && ((long long)done >= expect || t - last_activity > quiet_ms || t - expect_at > 60000))
			break;
		int n = epoll_wait(ep, evs, 256, expect >= 0 ? 1000 : -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("epoll_wait");
		}
		for (int k = 0; k < n; k++) {
			if (evs[k].data.ptr == &sfd_tag) {
				stop = 1;
			} else if (evs[k].data.ptr == &in_tag) {
				ssize_t r = read(0, inbuf + inlen, sizeof(inbuf) - 1 - inlen);
				if (r <= 0) { /* stdin closed without a count: stop listening to it */
					epoll_ctl(ep, EPOLL_CTL_DEL, 0, NULL);
					continue;
				}
				inlen += (size_t)r;
				inbuf[inlen] = 0;
				if (strchr(inbuf, '\n') && expect < 0) {
					expect = strtoll(inbuf, NULL, 10);
					expect_at = now_ms();
				}
			} else if (evs[k].data.ptr == &lfd_tag) {
				/* One accept per wakeup when slowed down, so the queue stays full. */
				for (int m = 0; m < (accept_delay_us || stall_ms ? 1 : 64); m++) {
					if (accept_delay_us)
						usleep(accept_delay_us);
					int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
					if (fd < 0) {
						if (errno == EAGAIN || errno == ECONNABORTED || errno == EINTR)
							break;
						die("accept4");
					}
					accepted++;
					last_activity = now_ms();
					struct conn *c = malloc(sizeof(*c) + (size_t)chunks * CHUNK + 1);
					if (!c)
						die("malloc");
					c->fd = fd;
					c->len = 0;
					c->bad = 0;
					c->accepted_ms = now_ms();
					c->next = &open_list;
					c->prev = open_list.prev;
					open_list.prev->next = c;
					open_list.prev = c;
					struct epoll_event ce = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = c };
					if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ce) < 0)
						die("epoll_ctl ADD");
					if (stall_ms && stall_every && accepted % stall_every == 0)
						usleep(stall_ms * 1000);
				}
			} else {
				struct conn *c = evs[k].data.ptr;
				unsigned long long before = ok + reordered + shortc + errors + longc;
				on_readable(c);
				if (ok + reordered + shortc + errors + longc != before)
					last_activity = now_ms();
			}
		}
	}
	unsigned long long open_empty = 0;
	for (struct conn *c = open_list.next; c != &open_list; c = c->next)
		open_empty += c->len == 0;
	printf("{\"event\":\"summary\",\"connections\":%llu,\"ok\":%llu,\"reordered\":%llu,\"short\":%llu,\"long\":%llu,\"errors\":%llu,"
	       "\"open\":%llu,\"open_empty\":%llu,\"drain_ms\":%.0f,\"example\":{\"conn\":%lld,\"pos\":%u,\"got\":%d},\"unfinished\":[",
	       accepted, ok, reordered, shortc, longc, errors, accepted - (ok + reordered + shortc + errors + longc), open_empty, expect >= 0 ? now_ms() - expect_at : 0.0, example, example_pos,
	       example < 0 ? -1 : (int)example_got);
	/* Why a connection is still open when the sidecar stops: what it has
	 * read, and its TCP state (a peer still retransmitting, a lost FIN). */
	int shown = 0;
	for (struct conn *c = open_list.next; c != &open_list && shown < 8; c = c->next, shown++) {
		struct tcp_info ti = { 0 };
		socklen_t tl = sizeof(ti);
		struct sockaddr_in peer = { 0 };
		socklen_t pl = sizeof(peer);
		char ps[INET_ADDRSTRLEN] = "?";
		getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &tl);
		if (getpeername(c->fd, (struct sockaddr *)&peer, &pl) == 0)
			inet_ntop(AF_INET, &peer.sin_addr, ps, sizeof(ps));
		printf("%s{\"read\":%zu,\"first_id\":%d,\"age_ms\":%.0f,\"peer\":\"%s:%u\",\"state\":%u,\"ca_state\":%u,"
		       "\"last_data_recv_ms\":%u,\"rcv_space\":%u,\"segs_in\":%u,\"data_segs_in\":%u,\"bytes_received\":%llu,\"unacked\":%u}",
		       shown ? "," : "", c->len, c->len >= CHUNK ? (int)get32(c->buf + 4) : -1, now_ms() - c->accepted_ms, ps,
		       ntohs(peer.sin_port), ti.tcpi_state, ti.tcpi_ca_state, ti.tcpi_last_data_recv, ti.tcpi_rcv_space, ti.tcpi_segs_in,
		       ti.tcpi_data_segs_in, (unsigned long long)ti.tcpi_bytes_received, ti.tcpi_unacked);
	}
	printf("]}\n");
	fflush(stdout);
	return 0;
}

static unsigned num(const char *s, unsigned max)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);
	if (*s == 0 || *end != 0 || v > max) {
		fprintf(stderr, "mc-order-check: %s is not a number up to %u\n", s, max);
		exit(2);
	}
	return (unsigned)v;
}

int main(int argc, char **argv)
{
	const char *usage = "usage: mc-order-check app --connect IPv4:PORT [--threads N] [--conns N] [--chunks N] [--confirm-ms 60000]\n"
			    "       mc-order-check sidecar --listen IPv4:PORT [--backlog N] [--chunks N] [--accept-delay-us N] [--stall-ms S --stall-every K] [--quiet-ms 5000]\n";
	if (argc < 2) {
		fputs(usage, stderr);
		return 2;
	}
	const char *mode = argv[1], *addr = NULL;
	int backlog = 8;
	unsigned delay = 0, stall_ms = 0, stall_every = 0, quiet_ms = 5000;
	for (int i = 2; i < argc; i++) {
		const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!v) {
			fputs(usage, stderr);
			return 2;
		}
		i++;
		if (!strcmp(o, "--connect") || !strcmp(o, "--listen"))
			addr = v;
		else if (!strcmp(o, "--threads"))
			threads = num(v, 1024);
		else if (!strcmp(o, "--conns"))
			conns = num(v, 10000000);
		else if (!strcmp(o, "--chunks"))
			chunks = num(v, MAX_CHUNKS);
		else if (!strcmp(o, "--backlog"))
			backlog = (int)num(v, 65535);
		else if (!strcmp(o, "--accept-delay-us"))
			delay = num(v, 1000000);
		else if (!strcmp(o, "--stall-ms"))
			stall_ms = num(v, 10000);
		else if (!strcmp(o, "--stall-every"))
			stall_every = num(v, 10000000);
		else if (!strcmp(o, "--quiet-ms"))
			quiet_ms = num(v, 60000);
		else if (!strcmp(o, "--confirm-ms"))
			confirm_ms = num(v, 600000);
		else {
			fputs(usage, stderr);
			return 2;
		}
	}
	if (!addr || threads == 0 || chunks == 0) {
		fputs(usage, stderr);
		return 2;
	}
	if (!strcmp(mode, "app")) {
		parse_addr(addr, &dst);
		return app_main();
	}
	if (!strcmp(mode, "sidecar"))
		return sidecar_main(addr, backlog, delay, stall_ms, stall_every, quiet_ms);
	fputs(usage, stderr);
	return 2;
}
