#include "cni_config.h"

#include <stdio.h>
#include <string.h>

#include "cni_error.h"

int netconf_parse(const char *buf, size_t len, struct netconf *nc, char *msg, size_t msg_len) {
  memset(nc, 0, sizeof *nc);
  nc->agent_socket = MESHCAP_DEFAULT_AGENT_SOCKET;
  nc->agent_timeout_ms = MESHCAP_DEFAULT_AGENT_TIMEOUT_MS;

  json_error_t jerr;
  nc->root = json_loadb(buf, len, 0, &jerr);
  if (nc->root == NULL) {
    snprintf(msg, msg_len, "network config on stdin is not valid JSON: %s (line %d, column %d)",
             jerr.text, jerr.line, jerr.column);
    return CNI_ERR_DECODE;
  }
  if (!json_is_object(nc->root)) {
    snprintf(msg, msg_len, "network config on stdin must be a JSON object");
    return CNI_ERR_DECODE;
  }

  json_t *v = json_object_get(nc->root, "cniVersion");
  if (v != NULL && !json_is_string(v)) {
    snprintf(msg, msg_len, "cniVersion must be a string");
    return CNI_ERR_INVALID_CONFIG;
  }
  nc->cni_version = v != NULL ? json_string_value(v) : NULL;

  json_t *s = json_object_get(nc->root, "agentSocket");
  if (s != NULL) {
    if (!json_is_string(s) || json_string_length(s) == 0 || json_string_length(s) > 107 ||
        json_string_value(s)[0] != '/') {
      snprintf(msg, msg_len, "agentSocket must be an absolute path of at most 107 bytes");
      return CNI_ERR_INVALID_CONFIG;
    }
    nc->agent_socket = json_string_value(s);
  }

  json_t *t = json_object_get(nc->root, "agentTimeoutMs");
  if (t != NULL) {
    if (!json_is_integer(t) || json_integer_value(t) < 1 ||
        json_integer_value(t) > MESHCAP_MAX_AGENT_TIMEOUT_MS) {
      snprintf(msg, msg_len, "agentTimeoutMs must be an integer from 1 to %d",
               MESHCAP_MAX_AGENT_TIMEOUT_MS);
      return CNI_ERR_INVALID_CONFIG;
    }
    nc->agent_timeout_ms = (long)json_integer_value(t);
  }

  json_t *ex = json_object_get(nc->root, "excludeNamespaces");
  if (ex != NULL) {
    size_t i;
    json_t *item;
    if (!json_is_array(ex)) goto bad_exclude;
    json_array_foreach(ex, i, item) {
      if (!json_is_string(item)) goto bad_exclude;
    }
    nc->exclude_namespaces = ex;
  }

  json_t *pr = json_object_get(nc->root, "prevResult");
  if (pr != NULL && !json_is_null(pr)) {
    if (!json_is_object(pr)) {
      snprintf(msg, msg_len, "prevResult must be a JSON object");
      return CNI_ERR_INVALID_CONFIG;
    }
    nc->prev_result = pr;
  }
  return 0;

bad_exclude:
  snprintf(msg, msg_len, "excludeNamespaces must be an array of strings");
  return CNI_ERR_INVALID_CONFIG;
}

int netconf_excludes(const struct netconf *nc, const char *pod_namespace) {
  if (nc->exclude_namespaces == NULL || pod_namespace == NULL) return 0;
  size_t i;
  json_t *item;
  json_array_foreach(nc->exclude_namespaces, i, item) {
    if (strcmp(json_string_value(item), pod_namespace) == 0) return 1;
  }
  return 0;
}

void netconf_free(struct netconf *nc) {
  json_decref(nc->root);
  nc->root = NULL;
}
