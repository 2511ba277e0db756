#include "result_convert.h"

#include <string.h>

/* Fields 1.1.0 added to interfaces and routes. libcni's conversion to the
 * 0.x format copies only the 0.x fields, and so does the agent's
 * convertResult (src/cni/result.ts). */
static const char *const interface_11_fields[] = {"mtu", "socketPath", "pciID", NULL};
static const char *const route_11_fields[] = {"mtu", "advmss", "priority", "table", "scope", NULL};

static void drop_fields(json_t *list, const char *const *fields) {
  if (!json_is_array(list)) return;
  size_t i;
  json_t *item;
  json_array_foreach(list, i, item) {
    if (!json_is_object(item)) continue;
    for (size_t f = 0; fields[f] != NULL; f++) json_object_del(item, fields[f]);
  }
}

json_t *result_for_version(json_t *prev, const char *version) {
  json_t *out = prev != NULL ? json_deep_copy(prev) : json_object();
  if (out == NULL) return NULL;
  json_object_set_new(out, "cniVersion", json_string(version));

  int pre_1_0 = version[0] == '0';
  if (pre_1_0) {
    drop_fields(json_object_get(out, "interfaces"), interface_11_fields);
    drop_fields(json_object_get(out, "routes"), route_11_fields);
  }
  json_t *ips = json_object_get(out, "ips");
  if (!json_is_array(ips)) return out;
  size_t i;
  json_t *ip;
  json_array_foreach(ips, i, ip) {
    if (!json_is_object(ip)) continue;
    if (!pre_1_0) {
      json_object_del(ip, "version");
      continue;
    }
    if (json_object_get(ip, "version") != NULL) continue;
    /* 0.3.0-0.4.0 require the family; an IPv6 address always holds a ':'. */
    const char *addr = json_string_value(json_object_get(ip, "address"));
    if (addr != NULL) json_object_set_new(ip, "version", json_string(strchr(addr, ':') ? "6" : "4"));
  }
  return out;
}
