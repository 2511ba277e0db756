/* The few network-config keys the forwarder itself needs; the agent
 * validates the rest. */
#ifndef MESHCAP_CNI_CONFIG_H
#define MESHCAP_CNI_CONFIG_H

#include <jansson.h>
#include <stddef.h>

#define MESHCAP_DEFAULT_AGENT_SOCKET "/var/run/meshcap/cni.sock"
#define MESHCAP_DEFAULT_AGENT_TIMEOUT_MS 10000
#define MESHCAP_MAX_AGENT_TIMEOUT_MS 600000

struct netconf {
  json_t *root;            /* owned */
  const char *cni_version; /* NULL when absent (VERSION allows that) */
  const char *agent_socket;
  long agent_timeout_ms;
  json_t *exclude_namespaces; /* array of strings or NULL (borrowed) */
  json_t *prev_result;        /* object or NULL (borrowed) */
};

/* Parses and checks stdin. On failure returns the CNI error code and fills
 * msg; nc->cni_version is set as soon as it is known so errors can echo it. */
int netconf_parse(const char *buf, size_t len, struct netconf *nc, char *msg, size_t msg_len);

int netconf_excludes(const struct netconf *nc, const char *pod_namespace);

void netconf_free(struct netconf *nc);

#endif
