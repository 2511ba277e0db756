#include "cni_error.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const cni_supported_versions[] = {"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", NULL};

int cni_version_supported(const char *version) {
  if (version == NULL) return 0;
  for (size_t i = 0; cni_supported_versions[i] != NULL; i++)
    if (strcmp(version, cni_supported_versions[i]) == 0) return 1;
  return 0;
}

/* N.N.N with at most 3 digits per part: enough to echo a plausible version and
 * never echo arbitrary input back to the runtime. */
static int looks_like_version(const char *v) {
  if (v == NULL) return 0;
  for (int part = 0; part < 3; part++) {
    int digits = 0;
    while (*v >= '0' && *v <= '9') { v++; digits++; }
    if (digits == 0 || digits > 3) return 0;
    if (part < 2) {
      if (*v != '.') return 0;
      v++;
    }
  }
  return *v == '\0';
}

const char *cni_error_version(const char *requested) {
  return looks_like_version(requested) ? requested : CNI_LATEST_VERSION;
}

int cni_write_stdout(const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(STDOUT_FILENO, buf, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

char *cni_format_error(const char *version, int code, const char *msg, const char *details) {
  json_t *err = json_object();
  /* json_string rejects invalid UTF-8; fall back so an error is always printed. */
  json_t *m = json_string(msg);
  json_object_set_new(err, "cniVersion", json_string(cni_error_version(version)));
  json_object_set_new(err, "code", json_integer(code));
  json_object_set_new(err, "msg", m != NULL ? m : json_string("(message not valid UTF-8)"));
  if (details != NULL) {
    json_t *d = json_string(details);
    if (d != NULL) json_object_set_new(err, "details", d);
  }
  char *out = json_dumps(err, JSON_COMPACT);
  json_decref(err);
  if (out == NULL) return NULL;
  size_t n = strlen(out);
  char *line = realloc(out, n + 2);
  if (line == NULL) {
    free(out);
    return NULL;
  }
  line[n] = '\n';
  line[n + 1] = '\0';
  return line;
}

void cni_print_error(const char *version, int code, const char *msg, const char *details) {
  char *out = cni_format_error(version, code, msg, details);
  if (out != NULL) {
    cni_write_stdout(out, strlen(out));
    free(out);
  } else {
    static const char oom[] = "{\"cniVersion\":\"" CNI_LATEST_VERSION "\",\"code\":999,\"msg\":\"out of memory\"}\n";
    cni_write_stdout(oom, sizeof oom - 1);
  }
}
