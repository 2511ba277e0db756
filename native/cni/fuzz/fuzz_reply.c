/* libFuzzer harness: what the agent answers (or anything on its socket).
 * The first byte picks the config's cniVersion and the verb (ADD or not), the
 * rest is the reply. Whatever it is, the forwarder's relay (relay.c) must
 * exit 0..125, a non-zero exit must carry a CNI error object, and an ADD
 * success must be a result of the config's cniVersion. Run by
 * scripts/fuzz-cni.mjs. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>

#include "cni_error.h"
#include "relay.h"
#include "result_convert.h"

static void must(int ok) {
  if (!ok) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const char *version = cni_supported_versions[data[0] % 5];
  int is_add = (data[0] & 0x80) == 0;
  struct relay_out out;
  if (relay_decide((const char *)data + 1, size - 1, version, "/run/meshcap/cni.sock", is_add, &out) != 0) {
    free(out.text);
    return 0;
  }
  must(out.exit_code >= 0 && out.exit_code <= 125 && out.text != NULL);
  if (out.exit_code != 0) must(relay_is_error_object(out.text, out.len));
  if (out.exit_code == 0 && is_add) {
    json_t *r = json_loadb(out.text, out.len, 0, NULL);
    must(result_is_of_version(r, version));
    json_decref(r);
  }
  free(out.text);
  return 0;
}
