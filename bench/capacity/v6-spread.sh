#!/usr/bin/env bash
# Issue 19 item 4, IPv6 (docs/bench-capacity.md#ipv6): runs v6-spread.py once per mode,
# each in its own throwaway netns (nothing leaves it: a veth whose both ends are inside,
# no default route). Needs root, python3, ip6tables.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ns=""
cleanup() { [ -n "$ns" ] && ip netns del "$ns" 2>/dev/null || true; }
trap cleanup EXIT
for mode in loop anyip anyip-lo nat; do
  ns="mc-v6spread-$$-$mode"
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$ns" link add v0 type veth peer name v1
  ip -n "$ns" addr add 2001:db8:70::1/64 dev v0 nodad
  ip -n "$ns" link set v0 up
  ip -n "$ns" link set v1 up
  ip -n "$ns" -6 route add 2001:db8:71::/64 dev v0   # the destinations, before NAT
  ip -n "$ns" -6 route add local fd6d:6300::/96 dev lo table local
  ip netns exec "$ns" sysctl -qw net.ipv4.ip_local_port_range="40000 40063" net.ipv4.tcp_tw_reuse=2
  [ "$mode" = nat ] && ip netns exec "$ns" ip6tables -t nat -A OUTPUT -p tcp -d 2001:db8:71::/64 -j REDIRECT --to-ports 15001
  ip netns exec "$ns" timeout 60 python3 "$here/v6-spread.py" "$mode"
  ip netns del "$ns"
  ns=""
done
