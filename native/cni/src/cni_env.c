#include "cni_env.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

const char *const cni_wire_env_names[CNI_WIRE_ENV_COUNT] = {"CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS",
                                                            "CNI_PATH"};
const char *const cni_wire_env_keys[CNI_WIRE_ENV_COUNT] = {"containerId", "netns", "ifname", "args", "path"};

const char *cni_args_pod_namespace(const char *args, char *out, size_t out_len) {
  static const char key[] = "K8S_POD_NAMESPACE=";
  for (const char *p = args; p != NULL && *p != '\0';) {
    const char *end = strchr(p, ';');
    size_t seg = end != NULL ? (size_t)(end - p) : strlen(p);
    if (seg > sizeof key - 1 && strncmp(p, key, sizeof key - 1) == 0) {
      size_t vlen = seg - (sizeof key - 1);
      if (vlen >= out_len) return NULL;
      memcpy(out, p + sizeof key - 1, vlen);
      out[vlen] = '\0';
      return out;
    }
    p = end != NULL ? end + 1 : NULL;
  }
  return NULL;
}

char *cni_build_request(int wire_version, const char *command, const char *const values[CNI_WIRE_ENV_COUNT],
                        const char *stdin_text, size_t stdin_len, const char *netns_cookie, char *msg,
                        size_t msg_len) {
  json_t *req = json_object();
  if (req == NULL) goto oom;
  json_object_set_new(req, "v", json_integer(wire_version));
  json_object_set_new(req, "command", json_string(command));
  for (size_t i = 0; i < CNI_WIRE_ENV_COUNT; i++) {
    json_t *s = json_string(values[i] != NULL ? values[i] : "");
    if (s == NULL) {
      snprintf(msg, msg_len, "%s is not valid UTF-8", cni_wire_env_names[i]);
      json_decref(req);
      return NULL;
    }
    json_object_set_new(req, cni_wire_env_keys[i], s);
  }
  json_t *in = json_stringn(stdin_text, stdin_len);
  if (in == NULL) {
    snprintf(msg, msg_len, "network config on stdin is not valid UTF-8");
    json_decref(req);
    return NULL;
  }
  json_object_set_new(req, "stdin", in);
  if (netns_cookie != NULL) json_object_set_new(req, "netnsCookie", json_string(netns_cookie));
  char *out = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  if (out != NULL) return out;
oom:
  snprintf(msg, msg_len, "out of memory building the agent request");
  return NULL;
}
