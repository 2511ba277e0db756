/* meshcap-cni: the CNI plugin the container runtime executes on the host.
 *
 * It answers VERSION itself and forwards every other verb to the meshcap
 * agent over a unix socket (protocol: docs/cni.md), then prints the agent's
 * answer and exits with its code. When the agent cannot be reached it does
 * the one safe thing per verb (see fallback()). Input is bounded in size and
 * time: stdin above STDIN_CAP or not closed within STDIN_TIMEOUT_MS, and an
 * agent silent past agentTimeoutMs, all end in a CNI error, never a hang. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_client.h"
#include "bounded_io.h"
#include "cni_config.h"
#include "cni_env.h"
#include "cni_error.h"
#include "netns_cookie.h"
#include "relay.h"
#include "result_convert.h"

#define STDIN_CAP (1u << 20)        /* 1 MiB: real configs are a few KiB */
#define STDIN_TIMEOUT_MS 5000       /* runtimes write stdin and close it at once */
#define REPLY_CAP (4u << 20)        /* agent replies echo prevResult, < STDIN_CAP */
#define WIRE_PROTOCOL_VERSION 1
#if defined(__has_include)
#if __has_include("meshcap_build_info.h")
#include "meshcap_build_info.h" /* written by scripts/build.mjs */
#endif
#endif
#ifndef MESHCAP_VERSION
#ifdef MESHCAP_PACKAGE_VERSION
#define MESHCAP_VERSION MESHCAP_PACKAGE_VERSION
#else
#define MESHCAP_VERSION "unknown"
#endif
#endif
#ifndef MESHCAP_COMMIT
#define MESHCAP_COMMIT "unknown"
#endif

enum verb { V_ADD, V_DEL, V_CHECK, V_STATUS, V_GC, V_VERSION, V_UNKNOWN };

static const struct {
  const char *name;
  enum verb verb;
  const char *min_version; /* first spec version that has the verb */
  int needs_container;     /* CNI_CONTAINERID + CNI_IFNAME required */
  int needs_netns;         /* CNI_NETNS required */
} verbs[] = {
    {"ADD", V_ADD, "0.3.0", 1, 1},    {"DEL", V_DEL, "0.3.0", 1, 0},
    {"CHECK", V_CHECK, "0.4.0", 1, 1}, {"STATUS", V_STATUS, "1.1.0", 0, 0},
    {"GC", V_GC, "1.1.0", 0, 0},       {"VERSION", V_VERSION, "0.3.0", 0, 0},
};

static char stdin_buf[STDIN_CAP];

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v != NULL && v[0] != '\0' ? v : NULL;
}

static int fail(const char *version, int code, const char *msg, const char *details) {
  cni_print_error(version, code, msg, details);
  return 1;
}

/* Semver order for the x.y.z versions we know (all single digits here). */
static int version_at_least(const char *v, const char *min) { return strcmp(v, min) >= 0; }

static int print_json(json_t *obj) {
  char *out = json_dumps(obj, JSON_COMPACT);
  if (out == NULL) return fail(NULL, CNI_ERR_INTERNAL, "out of memory formatting the result", NULL);
  int rc = cni_write_stdout(out, strlen(out)) == 0 && cni_write_stdout("\n", 1) == 0 ? 0 : 1;
  free(out);
  return rc;
}

static int print_version_info(const char *requested) {
  json_t *info = json_object();
  json_t *list = json_array();
  for (size_t i = 0; cni_supported_versions[i] != NULL; i++)
    json_array_append_new(list, json_string(cni_supported_versions[i]));
  json_object_set_new(info, "cniVersion",
                      json_string(cni_version_supported(requested) ? requested : CNI_LATEST_VERSION));
  json_object_set_new(info, "supportedVersions", list);
  int rc = print_json(info);
  json_decref(info);
  return rc;
}

/* The agent is unreachable: per verb, the answer that keeps pods safe.
 * ADD must not succeed for a pod that may need its redirect (code 11 makes the
 * runtime retry), unless its namespace is excluded from meshing. DEL and GC
 * succeed: the agent reconciles its own state when it is back, and a failing
 * DEL would only wedge pod teardown. */
static int fallback(enum verb verb, const struct netconf *nc, const char *why) {
  char ns_buf[256];
  const char *ns = cni_args_pod_namespace(env("CNI_ARGS"), ns_buf, sizeof ns_buf);
  int excluded = netconf_excludes(nc, ns);
  char msg[1024];
  switch (verb) {
    case V_ADD:
    case V_CHECK:
      if (excluded) {
        if (verb == V_CHECK) return 0;
        /* the agent's conversion (src/cni/result.ts), so the pod gets the
         * same result whether or not the agent answered */
        json_t *res;
        int code = result_convert(nc->prev_result, nc->cni_version, &res, msg, sizeof msg);
        if (code != 0) return fail(nc->cni_version, code, msg, NULL);
        int rc = print_json(res);
        json_decref(res);
        return rc;
      }
      snprintf(msg, sizeof msg, "meshcap agent unreachable at %s: %s", nc->agent_socket, why);
      return fail(nc->cni_version, CNI_ERR_TRY_AGAIN_LATER, msg,
                  "the pod's traffic redirect is set up by the meshcap agent before the pod starts; "
                  "check that the meshcap agent runs on this node and serves this socket "
                  "(config key agentSocket); the runtime retries");
    case V_STATUS:
      snprintf(msg, sizeof msg, "meshcap agent unreachable at %s: %s", nc->agent_socket, why);
      return fail(nc->cni_version, CNI_ERR_PLUGIN_NOT_AVAILABLE, msg, NULL);
    case V_DEL:
    case V_GC:
    default:
      return 0;
  }
}

static int relay_reply(const char *reply, size_t len, const struct netconf *nc, enum verb verb) {
  struct relay_out out;
  if (relay_decide(reply, len, nc->cni_version, nc->agent_socket, verb == V_ADD, &out) != 0) {
    free(out.text);
    return fail(nc->cni_version, CNI_ERR_INTERNAL, "out of memory relaying the agent's answer", NULL);
  }
  int rc = out.exit_code;
  if (cni_write_stdout(out.text, out.len) != 0) rc = rc != 0 ? rc : 1;
  free(out.text);
  return rc;
}

/* Run by hand (no CNI_COMMAND): what this binary is, on stderr, exit 0, as
 * the reference plugins do (skel's "about" text), so an operator can see which
 * build sits in the CNI bin dir next to which agent. */
static int print_about(void) {
  fprintf(stderr, "meshcap-cni v%s (commit %s): the meshcap CNI plugin; forwards each CNI verb to the meshcap agent on this node (wire protocol %d)\n",
          MESHCAP_VERSION, MESHCAP_COMMIT, WIRE_PROTOCOL_VERSION);
  fprintf(stderr, "CNI protocol versions supported: ");
  for (size_t i = 0; cni_supported_versions[i] != NULL; i++)
    fprintf(stderr, "%s%s", i > 0 ? ", " : "", cni_supported_versions[i]);
  fprintf(stderr, "\n");
  return 0;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  char msg[1024];

  const char *command = env("CNI_COMMAND");
  if (command == NULL) return print_about();
  size_t vi = 0;
  while (vi < sizeof verbs / sizeof verbs[0] && strcmp(verbs[vi].name, command) != 0) vi++;
  if (vi == sizeof verbs / sizeof verbs[0]) {
    snprintf(msg, sizeof msg, "CNI_COMMAND %.64s is unknown (want ADD, DEL, CHECK, STATUS, GC or VERSION)", command);
    return fail(NULL, CNI_ERR_INVALID_ENV, msg, NULL);
  }
  enum verb verb = verbs[vi].verb;

  /* The spec's required variables per verb; CNI_ARGS and CNI_PATH are optional. */
  const char *missing[3];
  size_t nmissing = 0;
  if (verbs[vi].needs_container && env("CNI_CONTAINERID") == NULL) missing[nmissing++] = "CNI_CONTAINERID";
  if (verbs[vi].needs_netns && env("CNI_NETNS") == NULL) missing[nmissing++] = "CNI_NETNS";
  if (verbs[vi].needs_container && env("CNI_IFNAME") == NULL) missing[nmissing++] = "CNI_IFNAME";
  if (nmissing > 0) {
    snprintf(msg, sizeof msg, "%s%s%s%s%s %s not set (required for %s)", missing[0],
             nmissing > 1 ? ", " : "", nmissing > 1 ? missing[1] : "", nmissing > 2 ? ", " : "",
             nmissing > 2 ? missing[2] : "", nmissing > 1 ? "are" : "is", command);
    return fail(NULL, CNI_ERR_INVALID_ENV, msg, NULL);
  }

  ssize_t n = read_bounded(0, stdin_buf, STDIN_CAP, mono_ms() + STDIN_TIMEOUT_MS);
  if (n == BIO_ERROR && errno == EBADF) n = 0; /* no stdin at all: same as empty */
  if (n == BIO_TOO_BIG) {
    snprintf(msg, sizeof msg, "network config on stdin exceeds %u bytes; refused unread", STDIN_CAP);
    return fail(NULL, CNI_ERR_INVALID_CONFIG, msg, NULL);
  }
  if (n == BIO_TIMEOUT) {
    snprintf(msg, sizeof msg, "stdin was not closed within %d ms", STDIN_TIMEOUT_MS);
    return fail(NULL, CNI_ERR_IO, msg, NULL);
  }
  if (n < 0) {
    snprintf(msg, sizeof msg, "reading stdin: %s", strerror(errno));
    return fail(NULL, CNI_ERR_IO, msg, NULL);
  }

  if (verb == V_VERSION && n == 0) return print_version_info(NULL);
  if (n == 0) return fail(NULL, CNI_ERR_DECODE, "network config on stdin is empty", NULL);

  struct netconf nc;
  int code = netconf_parse(stdin_buf, (size_t)n, &nc, msg, sizeof msg);
  if (code != 0) {
    int rc = fail(nc.cni_version, code, msg, NULL);
    netconf_free(&nc);
    return rc;
  }
  if (verb == V_VERSION) {
    int rc = print_version_info(nc.cni_version);
    netconf_free(&nc);
    return rc;
  }
  if (!cni_version_supported(nc.cni_version)) {
    snprintf(msg, sizeof msg, "cniVersion %.32s is not supported (supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0)",
             nc.cni_version != NULL ? nc.cni_version : "(missing)");
    int rc = fail(nc.cni_version, CNI_ERR_INCOMPATIBLE_VERSION, msg, NULL);
    netconf_free(&nc);
    return rc;
  }
  if (!version_at_least(nc.cni_version, verbs[vi].min_version)) {
    snprintf(msg, sizeof msg, "config version %s does not allow %s (needs %s or later)", nc.cni_version,
             command, verbs[vi].min_version);
    int rc = fail(nc.cni_version, CNI_ERR_INCOMPATIBLE_VERSION, msg, NULL);
    netconf_free(&nc);
    return rc;
  }

  const char *values[CNI_WIRE_ENV_COUNT];
  for (size_t i = 0; i < CNI_WIRE_ENV_COUNT; i++) values[i] = getenv(cni_wire_env_names[i]);
  /* ADD: the pod netns's cookie, so the agent need not enter the netns
   * itself; when it cannot be read here the agent looks it up (and reports). */
  char cookie_buf[24];
  const char *cookie = NULL;
  uint64_t cookie_val = 0;
  if (verb == V_ADD && netns_cookie_of(env("CNI_NETNS"), &cookie_val) == 0 && cookie_val != 0) {
    snprintf(cookie_buf, sizeof cookie_buf, "%" PRIu64, cookie_val);
    cookie = cookie_buf;
  }
  char *req = cni_build_request(WIRE_PROTOCOL_VERSION, command, values, stdin_buf, (size_t)n, cookie, msg, sizeof msg);
  if (req == NULL) {
    int rc = fail(nc.cni_version, CNI_ERR_INVALID_ENV, msg, NULL);
    netconf_free(&nc);
    return rc;
  }
  char *reply = malloc(REPLY_CAP);
  if (reply == NULL) {
    free(req);
    int rc = fail(nc.cni_version, CNI_ERR_INTERNAL, "out of memory", NULL);
    netconf_free(&nc);
    return rc;
  }
  size_t reply_len = 0;
  char why[256] = "";
  enum agent_status st = agent_exchange(nc.agent_socket, req, strlen(req), mono_ms() + nc.agent_timeout_ms,
                                        reply, REPLY_CAP, &reply_len, why, sizeof why);
  free(req);
  int rc;
  if (st == AGENT_OK) {
    rc = relay_reply(reply, reply_len, &nc, verb);
  } else if (st == AGENT_UNREACHABLE) {
    if (strncmp(why, "no answer before the deadline", 29) == 0) {
      char with_ms[320];
      snprintf(with_ms, sizeof with_ms, "%s, agentTimeoutMs %ld", why, nc.agent_timeout_ms);
      rc = fallback(verb, &nc, with_ms);
    } else {
      rc = fallback(verb, &nc, why);
    }
  } else {
    snprintf(msg, sizeof msg, "meshcap agent at %s: %s", nc.agent_socket, why);
    rc = fail(nc.cni_version, CNI_ERR_INTERNAL, msg, NULL);
  }
  free(reply);
  netconf_free(&nc);
  return rc;
}
