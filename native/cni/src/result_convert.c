#include "result_convert.h"

#include <stdio.h>
#include <string.h>

#include "cni_error.h"

/* Fields 1.1.0 added to interfaces and routes. libcni's conversion to the
 * 0.x format copies only the 0.x fields, and so does the agent's
 * convertResult (src/cni/result.ts). */
static const char *const interface_11_fields[] = {"mtu", "socketPath", "pciID", NULL};
static const char *const route_11_fields[] = {"mtu", "advmss", "priority", "table", "scope", NULL};

/* src/cni/result.ts objectArray(): absent or null is no list; anything
 * else must be an array of objects. 1: a list, 0: none, -1: invalid. */
static int object_array(json_t *result, const char *key, char *msg, size_t msg_len) {
  json_t *v = json_object_get(result, key);
  if (v == NULL || json_is_null(v)) return 0;
  size_t i;
  json_t *item;
  if (json_is_array(v)) {
    int all = 1;
    json_array_foreach(v, i, item) all = all && json_is_object(item);
    if (all) return 1;
  }
  snprintf(msg, msg_len, "prevResult: %s must be an array of objects", key);
  return -1;
}

static void drop_fields(json_t *list, const char *const *fields) {
  size_t i;
  json_t *item;
  json_array_foreach(list, i, item) {
    for (size_t f = 0; fields[f] != NULL; f++) json_object_del(item, fields[f]);
  }
}

/* The checks in the order convertResult makes them, so the first problem
 * found (and its message) is the same on both sides. */
static int check_and_convert(json_t *out, int pre_1_0, char *msg, size_t msg_len) {
  if (json_object_get(out, "ip4") != NULL || json_object_get(out, "ip6") != NULL) {
    snprintf(msg, msg_len, "prevResult: 0.2.0-format results (ip4/ip6) are not supported");
    return CNI_ERR_INVALID_CONFIG;
  }
  json_t *from = json_object_get(out, "cniVersion");
  if (from != NULL && !cni_version_supported(json_string_value(from))) {
    if (json_is_string(from))
      snprintf(msg, msg_len, "prevResult: cniVersion %.64s is not supported", json_string_value(from));
    else
      snprintf(msg, msg_len, "prevResult: cniVersion must be a string");
    return CNI_ERR_INVALID_CONFIG;
  }
  size_t i;
  json_t *item;
  int has = object_array(out, "ips", msg, msg_len);
  if (has < 0) return CNI_ERR_INVALID_CONFIG;
  if (has) {
    json_array_foreach(json_object_get(out, "ips"), i, item) {
      const char *addr = json_string_value(json_object_get(item, "address"));
      if (addr == NULL) {
        snprintf(msg, msg_len, "prevResult: ips[%zu].address must be a string", i);
        return CNI_ERR_INVALID_CONFIG;
      }
      if (!pre_1_0) {
        json_object_del(item, "version");
        continue;
      }
      /* 0.3.0-0.4.0 require the family; an IPv6 address always holds a ':'. */
      const char *family = strchr(addr, ':') != NULL ? "6" : "4";
      json_t *v = json_object_get(item, "version");
      if (v != NULL && !(json_is_string(v) && strcmp(json_string_value(v), family) == 0)) {
        snprintf(msg, msg_len, "prevResult: ips[%zu].version must be \"%s\" for address %.64s", i, family, addr);
        return CNI_ERR_INVALID_CONFIG;
      }
      if (v == NULL && json_object_set_new(item, "version", json_string(family)) != 0) return CNI_ERR_INTERNAL;
    }
  }
  has = object_array(out, "interfaces", msg, msg_len);
  if (has < 0) return CNI_ERR_INVALID_CONFIG;
  if (has && pre_1_0) drop_fields(json_object_get(out, "interfaces"), interface_11_fields);
  has = object_array(out, "routes", msg, msg_len);
  if (has < 0) return CNI_ERR_INVALID_CONFIG;
  if (has) {
    json_array_foreach(json_object_get(out, "routes"), i, item) {
      if (!json_is_string(json_object_get(item, "dst"))) {
        snprintf(msg, msg_len, "prevResult: routes[%zu].dst must be a string", i);
        return CNI_ERR_INVALID_CONFIG;
      }
    }
    if (pre_1_0) drop_fields(json_object_get(out, "routes"), route_11_fields);
  }
  json_t *dns = json_object_get(out, "dns");
  if (dns != NULL && !json_is_object(dns)) {
    snprintf(msg, msg_len, "prevResult: dns must be an object");
    return CNI_ERR_INVALID_CONFIG;
  }
  return 0;
}

int result_convert(json_t *prev, const char *version, json_t **out, char *msg, size_t msg_len) {
  *out = NULL;
  if (prev != NULL && !json_is_null(prev) && !json_is_object(prev)) {
    snprintf(msg, msg_len, "prevResult: must be a JSON object");
    return CNI_ERR_INVALID_CONFIG;
  }
  json_t *r = prev != NULL && !json_is_null(prev) ? json_deep_copy(prev) : json_object();
  if (r == NULL) {
    snprintf(msg, msg_len, "out of memory converting prevResult");
    return CNI_ERR_INTERNAL;
  }
  int code = prev != NULL && !json_is_null(prev) ? check_and_convert(r, version[0] == '0', msg, msg_len) : 0;
  /* cniVersion is checked as the input's, then replaced */
  if (code == 0 && json_object_set_new(r, "cniVersion", json_string(version)) != 0) code = CNI_ERR_INTERNAL;
  if (code != 0) {
    if (code == CNI_ERR_INTERNAL) snprintf(msg, msg_len, "out of memory converting prevResult");
    json_decref(r);
    return code;
  }
  *out = r;
  return 0;
}

int result_is_of_version(json_t *r, const char *version) {
  if (!json_is_object(r) || !cni_version_supported(version)) return 0;
  json_t *conv = NULL;
  char msg[8];
  int ok = result_convert(r, version, &conv, msg, sizeof msg) == 0 && json_equal(conv, r);
  json_decref(conv);
  return ok;
}
