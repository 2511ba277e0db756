/* Reads and writes with a byte cap and a deadline: nothing the runtime or
 * the agent sends can make the forwarder allocate more or wait longer. */
#ifndef MESHCAP_BOUNDED_IO_H
#define MESHCAP_BOUNDED_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum {
  BIO_ERROR = -1,   /* errno is set */
  BIO_TOO_BIG = -2, /* more than cap bytes before EOF */
  BIO_TIMEOUT = -3, /* deadline passed before EOF */
};

/* CLOCK_MONOTONIC in milliseconds. */
int64_t mono_ms(void);

/* Reads fd until EOF into buf (capacity cap). Returns the length read or a
 * BIO_* code. Works on blocking and non-blocking fds (poll before read). */
ssize_t read_bounded(int fd, char *buf, size_t cap, int64_t deadline_ms);

/* Sends all of buf on a socket before the deadline (MSG_NOSIGNAL). Returns 0 or a BIO_* code. */
int send_all(int fd, const char *buf, size_t len, int64_t deadline_ms);

#endif
