/* libFuzzer harness: stdin as the runtime hands it to meshcap-cni. The
 * netconf parse (cni_config.c), the excluded-namespace test and the
 * prevResult conversion (result_convert.c), with what must hold for any
 * input: a parse failure has a CNI error the runtime can read, and every
 * converted result is a fixed point of the conversion (it is what the
 * forwarder would print for an excluded pod). Run by scripts/fuzz-cni.mjs. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cni_config.h"
#include "cni_error.h"
#include "relay.h"
#include "result_convert.h"

static void must(int ok) {
  if (!ok) abort();
}

/* The error the forwarder prints must be one a runtime parses. */
static void check_error_text(const char *version, int code, const char *msg) {
  char *e = cni_format_error(version, code, msg, NULL);
  must(e != NULL && relay_is_error_object(e, strlen(e)));
  free(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct netconf nc;
  char msg[1024];
  int code = netconf_parse((const char *)data, size, &nc, msg, sizeof msg);
  if (code != 0) {
    check_error_text(nc.cni_version, code, msg);
    netconf_free(&nc);
    return 0;
  }
  netconf_excludes(&nc, "kube-system");
  netconf_excludes(&nc, "");
  must(nc.agent_socket[0] == '/' && nc.agent_timeout_ms >= 1);
  if (cni_version_supported(nc.cni_version)) {
    json_t *out = NULL;
    code = result_convert(nc.prev_result, nc.cni_version, &out, msg, sizeof msg);
    if (code == 0) {
      must(result_is_of_version(out, nc.cni_version));
      char *text = json_dumps(out, JSON_COMPACT);
      must(text != NULL);
      free(text);
      json_decref(out);
    } else {
      must(out == NULL && code == CNI_ERR_INVALID_CONFIG && strncmp(msg, "prevResult: ", 12) == 0);
      check_error_text(nc.cni_version, code, msg);
    }
  }
  netconf_free(&nc);
  return 0;
}
