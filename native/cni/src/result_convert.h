/* The chain's prevResult in the format of the config's cniVersion: the
 * excluded-namespace passthrough when the agent is unreachable, and the check
 * of every ADD result the forwarder relays. The same rules, checks and
 * messages as the agent's convertResult (src/cni/result.ts); both run against
 * test/fixtures/cni/result-conversion.json (test/unit/cni/result-vectors.test.ts). */
#ifndef MESHCAP_RESULT_CONVERT_H
#define MESHCAP_RESULT_CONVERT_H

#include <jansson.h>
#include <stddef.h>

/* Converts prev (NULL or JSON null -> {"cniVersion"}) to `version` (a
 * supported version): a deep copy with cniVersion set; 0.3.x/0.4.0 ips carry
 * "version":"4"|"6" (derived from the address), 1.x dropped it; below 1.0.0
 * the 1.1-only interface and route fields go. Returns 0 and *out (caller
 * owns), CNI_ERR_INVALID_CONFIG with msg ("prevResult: ...") when prev is not
 * a result, or CNI_ERR_INTERNAL when out of memory. */
int result_convert(json_t *prev, const char *version, json_t **out, char *msg, size_t msg_len);

/* Is r a result in the format of `version`: converting it changes nothing
 * (so it carries that cniVersion and every field in that version's shape)? */
int result_is_of_version(json_t *r, const char *version);

#endif
