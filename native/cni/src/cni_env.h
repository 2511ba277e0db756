/* The runtime's environment as the forwarder reads it: CNI_ARGS and the
 * wire request built from the CNI variables. Pure: callers pass the values
 * (main.c passes getenv's), so the fuzz harnesses can call them too. */
#ifndef MESHCAP_CNI_ENV_H
#define MESHCAP_CNI_ENV_H

#include <stddef.h>

/* The CNI variables the wire request carries, in this order. */
#define CNI_WIRE_ENV_COUNT 5
extern const char *const cni_wire_env_names[CNI_WIRE_ENV_COUNT]; /* CNI_CONTAINERID, CNI_NETNS, ... */
extern const char *const cni_wire_env_keys[CNI_WIRE_ENV_COUNT];  /* containerId, netns, ... */

/* K8S_POD_NAMESPACE from CNI_ARGS ("K=V;K=V", may be NULL), copied into out
 * (NUL-terminated); NULL if absent or longer than out_len - 1. */
const char *cni_args_pod_namespace(const char *args, char *out, size_t out_len);

/* The wire request (docs/cni.md), malloc'd: {"v":1,"command",<keys>,"stdin"}
 * plus "netnsCookie" (decimal) when netns_cookie is not NULL.
 * values[i] may be NULL (sent as ""); stdin_text is JSON the caller parsed
 * (so valid UTF-8). NULL with msg set when a value is not valid UTF-8 or
 * memory ran out. */
char *cni_build_request(int wire_version, const char *command, const char *const values[CNI_WIRE_ENV_COUNT],
                        const char *stdin_text, size_t stdin_len, const char *netns_cookie, char *msg,
                        size_t msg_len);

#endif
