/* The kernel's cookie of a network namespace, looked up by the forwarder for
 * the agent: the pod's key in the eBPF maps. */
#ifndef MESHCAP_CNI_NETNS_COOKIE_H
#define MESHCAP_CNI_NETNS_COOKIE_H
#include <stdint.h>

/* The cookie of the netns at path (SO_NETNS_COOKIE of a socket made in it):
 * 0, or an errno (the agent then looks it up itself). The forwarder's own
 * netns is entered back before returning. */
int netns_cookie_of(const char *path, uint64_t *out);

#endif
