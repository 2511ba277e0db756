// SPDX-License-Identifier: Apache-2.0
/*
 * mc-bench-load: the app side of the datapath benchmark (scripts/bench-datapath.mjs).
 * One thread, one test, against an echo service at HOST:PORT:
 *
 *   rr      one connection, then SIZE-byte request / SIZE-byte echo, back to back
 *   crr     connect, one SIZE-byte request / echo, close; repeat
 *   stream  one connection, 64 KiB writes while reading the echo back
 *
 *   mc-bench-load --test rr|crr|stream --host IPv4 --port N [--size 1] [--seconds 1] [--warmup 0.1]
 *
 * The app does what an unmodified app does: connect() to the service address
 * and never learn about the mesh. Operations that finish during the warm-up
 * are not counted. Prints one JSON line: operations, ops/s, latency
 * percentiles (each operation timed on its own with CLOCK_MONOTONIC), bytes
 * echoed back, errors. Exits 1 on the first socket error, naming it.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *test = NULL;
static struct sockaddr_in dst = { .sin_family = AF_INET };
static const char *dst_text = "";
static size_t size = 1;
static double seconds = 1.0, warmup = 0.1;

static uint32_t *lat; /* nanoseconds per counted operation */
static size_t nlat, caplat;

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void fail(const char *what)
{
	fprintf(stderr, "mc-bench-load: %s test against %s: %s: %s\n", test, dst_text, what, strerror(errno));
	exit(1);
}

static void record(uint64_t ns)
{
	if (nlat == caplat) {
		caplat = caplat ? caplat * 2 : 1 << 16;
		lat = realloc(lat, caplat * sizeof(*lat));
		if (!lat)
			fail("realloc");
	}
	lat[nlat++] = ns > UINT32_MAX ? UINT32_MAX : (uint32_t)ns;
}

static int dial(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1;
	if (fd < 0)
		fail("socket");
	/* Small writes must leave at once, as an RPC client's do. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (struct sockaddr *)&dst, sizeof(dst)) < 0)
		fail("connect");
	return fd;
}

static void exchange(int fd, char *buf)
{
	size_t got = 0;
	if (write(fd, buf, size) != (ssize_t)size)
		fail("write");
	while (got < size) {
		ssize_t n = read(fd, buf + got, size - got);
		if (n == 0) {
			errno = ECONNRESET;
			fail("peer closed mid-exchange");
		}
		if (n < 0)
			fail("read");
		got += (size_t)n;
	}
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static double pct(double p)
{
	if (!nlat)
		return 0;
	size_t i = (size_t)(p * (double)nlat);
	if (i >= nlat)
		i = nlat - 1;
	return lat[i] / 1000.0;
}

int main(int argc, char **argv)
{
	const char *host = NULL;
	int port = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!v)
			goto usage;
		if (!strcmp(a, "--test"))
			test = v;
		else if (!strcmp(a, "--host"))
			host = v;
		else if (!strcmp(a, "--port"))
			port = atoi(v);
		else if (!strcmp(a, "--size"))
			size = (size_t)atol(v);
		else if (!strcmp(a, "--seconds"))
			seconds = atof(v);
		else if (!strcmp(a, "--warmup"))
			warmup = atof(v);
		else
			goto usage;
		i++;
	}
	if (!test || !host || port <= 0 || port > 65535 || size < 1 || size > 65536 || seconds <= 0 || warmup < 0 ||
	    (strcmp(test, "rr") && strcmp(test, "crr") && strcmp(test, "stream")))
		goto usage;
	if (inet_pton(AF_INET, host, &dst.sin_addr) != 1)
		goto usage;
	dst.sin_port = htons((uint16_t)port);
	static char text[64];
	snprintf(text, sizeof(text), "%s:%d", host, port);
	dst_text = text;
	signal(SIGPIPE, SIG_IGN);

	static char buf[64 * 1024];
	memset(buf, 'x', sizeof(buf));
	uint64_t t0 = now_ns();
	uint64_t t_count = t0 + (uint64_t)(warmup * 1e9), t_end = t_count + (uint64_t)(seconds * 1e9);
	unsigned long long ops = 0, connects = 0, bytes = 0;
	uint64_t now = t0;

	if (!strcmp(test, "rr")) {
		int fd = dial();
		connects++;
		while (now < t_end) {
			uint64_t s = now;
			exchange(fd, buf);
			now = now_ns();
			if (s >= t_count) {
				record(now - s);
				ops++;
				bytes += size;
			}
		}
		close(fd);
	} else if (!strcmp(test, "crr")) {
		while (now < t_end) {
			uint64_t s = now;
			int fd = dial();
			exchange(fd, buf);
			close(fd);
			connects++;
			now = now_ns();
			if (s >= t_count) {
				record(now - s);
				ops++;
				bytes += size;
			}
		}
	} else { /* stream: keep the pipe full in both directions, count what comes back */
		int fd = dial();
		struct pollfd p = { .fd = fd, .events = POLLIN | POLLOUT };
		static char rbuf[256 * 1024];
		connects++;
		while (now < t_end) {
			if (poll(&p, 1, 1000) < 0 && errno != EINTR)
				fail("poll");
			if (p.revents & POLLOUT) {
				if (send(fd, buf, sizeof(buf), MSG_DONTWAIT) < 0 && errno != EAGAIN)
					fail("send");
			}
			if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
				ssize_t n = recv(fd, rbuf, sizeof(rbuf), MSG_DONTWAIT);
				if (n == 0) {
					errno = ECONNRESET;
					fail("peer closed the stream");
				}
				if (n < 0 && errno != EAGAIN)
					fail("recv");
				now = now_ns();
				if (n > 0 && now >= t_count)
					bytes += (unsigned long long)n;
			}
			now = now_ns();
		}
		close(fd);
		ops = bytes / sizeof(buf);
	}

	double secs = (double)(now - t_count) / 1e9;
	qsort(lat, nlat, sizeof(*lat), cmp_u32);
	printf("{\"test\":\"%s\",\"dst\":\"%s\",\"size\":%zu,\"seconds\":%.4f,\"ops\":%llu,\"opsPerSec\":%.1f,"
	       "\"connects\":%llu,\"bytes\":%llu,\"gbitPerSec\":%.4f,\"p50us\":%.2f,\"p90us\":%.2f,\"p99us\":%.2f,\"maxus\":%.2f,",
	       test, dst_text, size, secs, ops, (double)ops / secs, connects, bytes, (double)bytes * 8 / secs / 1e9,
	       pct(0.50), pct(0.90), pct(0.99), nlat ? lat[nlat - 1] / 1000.0 : 0);
	/* the latency distribution for the bench's plot (empty for stream): [quantile, us] at 1%..99%, 99.5%, 99.9% */
	printf("\"cdf\":[");
	for (int q = 1; nlat && q <= 101; q++) {
		double p = q <= 99 ? q / 100.0 : q == 100 ? 0.995 : 0.999;
		printf("%s[%g,%.2f]", q > 1 ? "," : "", p, pct(p));
	}
	printf("]}\n");
	return 0;

usage:
	fprintf(stderr, "usage: mc-bench-load --test rr|crr|stream --host IPv4 --port N [--size 1..65536] [--seconds S] [--warmup S]\n");
	return 2;
}
