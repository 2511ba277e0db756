/* What the forwarder prints for the agent's reply: the runtime reads stdout
 * as the verb's result or error, so nothing it cannot parse is relayed. Pure
 * (no I/O): main.c prints what it returns, fuzz/fuzz_reply.c checks it. */
#ifndef MESHCAP_RELAY_H
#define MESHCAP_RELAY_H

#include <stddef.h>

struct relay_out {
  int exit_code; /* 0..125 */
  char *text;    /* malloc'd; what goes to stdout (may be empty) */
  size_t len;
};

/* reply: the agent's {"exitCode": 0..125, "stdout": string}. The agent's
 * stdout and exit code are relayed verbatim when they are what a runtime can
 * read: a failure carries a CNI error object (cniVersion, integer code >= 1,
 * msg, optional string details), an ADD success a result of the config's
 * cniVersion (result_is_of_version). Anything else becomes a CNI error 999
 * naming the socket and quoting the agent's output. version: the config's
 * cniVersion (supported). Returns 0, or -1 when out of memory. */
int relay_decide(const char *reply, size_t len, const char *version, const char *agent_socket, int is_add,
                 struct relay_out *out);

/* Is text one CNI error object (the shape above)? */
int relay_is_error_object(const char *text, size_t len);

#endif
