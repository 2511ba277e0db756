/* CNI spec error codes, supported versions, and the error JSON on stdout. */
#ifndef MESHCAP_CNI_ERROR_H
#define MESHCAP_CNI_ERROR_H

#include <stddef.h>

enum cni_error_code {
  CNI_ERR_INCOMPATIBLE_VERSION = 1,
  CNI_ERR_UNSUPPORTED_FIELD = 2,
  CNI_ERR_UNKNOWN_CONTAINER = 3,
  CNI_ERR_INVALID_ENV = 4,
  CNI_ERR_IO = 5,
  CNI_ERR_DECODE = 6,
  CNI_ERR_INVALID_CONFIG = 7,
  CNI_ERR_TRY_AGAIN_LATER = 11,
  CNI_ERR_PLUGIN_NOT_AVAILABLE = 50,
  CNI_ERR_LIMITED_CONNECTIVITY = 51,
  CNI_ERR_INTERNAL = 999,
};

/* The spec versions this plugin speaks, newest last; NULL-terminated. */
extern const char *const cni_supported_versions[];
#define CNI_LATEST_VERSION "1.1.0"

int cni_version_supported(const char *version);

/* The cniVersion to put in an error: the config's when it looks like a
 * version (the spec says "same as provided"), else the latest we speak. */
const char *cni_error_version(const char *requested);

/* Writes the whole buffer to stdout; returns 0 or -1. */
int cni_write_stdout(const char *buf, size_t len);

/* {"cniVersion","code","msg","details"?} and a newline, malloc'd (NULL when
 * out of memory). details may be NULL. */
char *cni_format_error(const char *version, int code, const char *msg, const char *details);

/* Prints cni_format_error's text on stdout (a fixed 999 error if out of memory). */
void cni_print_error(const char *version, int code, const char *msg, const char *details);

#endif
