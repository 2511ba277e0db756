#include "relay.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cni_error.h"
#include "result_convert.h"

int relay_is_error_object(const char *text, size_t len) {
  json_t *o = json_loadb(text, len, 0, NULL);
  json_t *details = json_object_get(o, "details");
  int ok = json_is_object(o) && json_is_string(json_object_get(o, "cniVersion")) &&
           json_is_integer(json_object_get(o, "code")) && json_integer_value(json_object_get(o, "code")) >= 1 &&
           json_is_string(json_object_get(o, "msg")) && (details == NULL || json_is_string(details));
  json_decref(o);
  return ok;
}

static int is_result_of(const char *text, size_t len, const char *version) {
  json_t *o = json_loadb(text, len, 0, NULL);
  int ok = result_is_of_version(o, version);
  json_decref(o);
  return ok;
}

static int copy_text(struct relay_out *out, int exit_code, const char *text, size_t len) {
  out->exit_code = exit_code;
  out->text = malloc(len + 1);
  if (out->text == NULL) return -1;
  memcpy(out->text, text, len);
  out->text[len] = '\0';
  out->len = len;
  return 0;
}

static int error_text(struct relay_out *out, const char *version, const char *msg, const char *details) {
  out->exit_code = 1;
  out->text = cni_format_error(version, CNI_ERR_INTERNAL, msg, details);
  if (out->text == NULL) return -1;
  out->len = strlen(out->text);
  return 0;
}

int relay_decide(const char *reply, size_t len, const char *version, const char *agent_socket, int is_add,
                 struct relay_out *out) {
  memset(out, 0, sizeof *out);
  json_error_t jerr;
  json_t *r = json_loadb(reply, len, 0, &jerr);
  json_t *code = json_object_get(r, "exitCode");
  json_t *stdout_text = json_object_get(r, "stdout");
  char msg[512];
  char details[300];
  int rc;
  if (!json_is_object(r) || !json_is_integer(code) || json_integer_value(code) < 0 ||
      json_integer_value(code) > 125 || !json_is_string(stdout_text)) {
    snprintf(msg, sizeof msg, "meshcap agent at %s sent a malformed reply (%s)", agent_socket,
             r == NULL && jerr.text[0] != '\0' ? jerr.text : "want {exitCode: 0..125, stdout: string}");
    rc = error_text(out, version, msg, NULL);
  } else {
    int exit_code = (int)json_integer_value(code);
    const char *text = json_string_value(stdout_text);
    size_t text_len = json_string_length(stdout_text);
    snprintf(details, sizeof details, "agent output: %.200s%s", text, text_len > 200 ? "..." : "");
    if (exit_code != 0 && !relay_is_error_object(text, text_len)) {
      snprintf(msg, sizeof msg, "meshcap agent at %s failed with exit code %d and %s", agent_socket, exit_code,
               text_len == 0 ? "no error message" : "an error that is not CNI error JSON");
      rc = error_text(out, version, msg, text_len == 0 ? NULL : details);
    } else if (exit_code == 0 && is_add && !is_result_of(text, text_len, version)) {
      snprintf(msg, sizeof msg, "meshcap agent at %s answered ADD with %s instead of a JSON result of cniVersion %s",
               agent_socket, text_len == 0 ? "nothing" : "output", version);
      rc = error_text(out, version, msg, text_len == 0 ? NULL : details);
    } else {
      rc = copy_text(out, exit_code, text, text_len);
    }
  }
  json_decref(r);
  return rc;
}
