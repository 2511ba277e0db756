/* libFuzzer harness: the CNI variables. The input is split at NUL bytes
 * into CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS,
 * CNI_PATH and stdin (environment values cannot hold a NUL). K8S_POD_NAMESPACE
 * from CNI_ARGS (cni_env.c) must be a NUL-free copy of a segment of it; the
 * wire request must be JSON that gives back exactly the values it was built
 * from, or a refusal naming the variable. Run by scripts/fuzz-cni.mjs. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cni_env.h"

static void must(int ok) {
  if (!ok) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *buf = malloc(size + 1);
  if (buf == NULL) return 0;
  memcpy(buf, data, size);
  buf[size] = '\0';
  const char *part[7] = {""};
  size_t n = 0;
  part[n++] = buf;
  for (size_t i = 0; i < size && n < 7; i++)
    if (buf[i] == '\0') part[n++] = buf + i + 1;
  for (size_t i = n; i < 7; i++) part[i] = "";

  const char *args = part[5];
  char ns[64];
  const char *got = cni_args_pod_namespace(args, ns, sizeof ns);
  if (got != NULL) {
    must(got == ns && strlen(ns) < sizeof ns);
    char needle[96] = "K8S_POD_NAMESPACE=";
    strcat(needle, ns);
    must(strstr(args, needle) != NULL);
  }

  const char *values[CNI_WIRE_ENV_COUNT] = {part[1], part[2], part[3], part[5], part[4]};
  const char *in = part[6];
  char msg[256];
  char *req = cni_build_request(1, part[0], values, in, strlen(in), NULL, msg, sizeof msg);
  if (req == NULL) {
    must(strstr(msg, "UTF-8") != NULL || strstr(msg, "memory") != NULL);
  } else {
    json_t *o = json_loads(req, 0, NULL);
    must(json_is_object(o) && json_integer_value(json_object_get(o, "v")) == 1);
    for (size_t i = 0; i < CNI_WIRE_ENV_COUNT; i++)
      must(strcmp(json_string_value(json_object_get(o, cni_wire_env_keys[i])), values[i]) == 0);
    must(strcmp(json_string_value(json_object_get(o, "stdin")), in) == 0);
    json_decref(o);
    free(req);
  }
  free(buf);
  return 0;
}
