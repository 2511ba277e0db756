#include "result_convert.h"

#include <string.h>

json_t *result_for_version(json_t *prev, const char *version) {
  json_t *out = prev != NULL ? json_deep_copy(prev) : json_object();
  if (out == NULL) return NULL;
  json_object_set_new(out, "cniVersion", json_string(version));

  int pre_1_0 = version[0] == '0';
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
