/* prevResult passthrough when the agent is unreachable: the result the
 * runtime gave us, in the format of the config's cniVersion. */
#ifndef MESHCAP_RESULT_CONVERT_H
#define MESHCAP_RESULT_CONVERT_H

#include <jansson.h>

/* Returns a new result object for `version` (a supported version): a deep
 * copy of prev (may be NULL -> {"cniVersion"}) with cniVersion set and ips
 * entries in that version's shape: 0.3.x/0.4.0 carry "version":"4"|"6",
 * 1.x dropped it; below 1.0.0 the 1.1-only interface and route fields go.
 * Caller owns the result. NULL on out-of-memory. */
json_t *result_for_version(json_t *prev, const char *version);

#endif
