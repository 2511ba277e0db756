/* One request/reply exchange with the meshcap agent over its unix socket. */
#ifndef MESHCAP_AGENT_CLIENT_H
#define MESHCAP_AGENT_CLIENT_H

#include <stddef.h>
#include <stdint.h>

enum agent_status {
  AGENT_OK = 0,          /* reply holds the agent's complete answer */
  AGENT_UNREACHABLE = 1, /* no socket, refused, closed without a word, or timed out */
  AGENT_BAD_REPLY = 2,   /* the agent answered something over the cap */
};

/* Connects to sock_path, sends req, half-closes, reads the reply until EOF.
 * Everything happens before deadline_ms (mono_ms clock). On failure, why
 * holds a human-readable cause (errno text or "timed out after N ms"). */
enum agent_status agent_exchange(const char *sock_path, const char *req, size_t req_len,
                                 int64_t deadline_ms, char *reply, size_t reply_cap,
                                 size_t *reply_len, char *why, size_t why_len);

#endif
