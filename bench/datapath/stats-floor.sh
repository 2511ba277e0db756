#!/bin/bash
# What kernel.bpf_stats_enabled's stopwatch itself adds to every program run
# (docs/bench-datapath.md, "The stopwatch's share"). --bpf-stats reports
# run_time_ns, which the kernel takes with a sched_clock() read on each side
# of every run, so each run's reading holds about one read's worth besides
# the program. Two measurements:
#  1. the stopwatch's whole cost per run: an empty tc program run 5,000,000
#     times by BPF_PROG_TEST_RUN (bpftool prog run ... repeat), which times
#     the whole loop itself, with kernel.bpf_stats_enabled 0 and then 1;
#  2. what an empty program reads per run where meshcap's run: a sockops and
#     a cgroup/connect4 program that only return 1, for N loopback
#     connections in a scratch cgroup and netns.
#
#   bench/datapath/stats-floor.sh [CONNECTIONS (default 20000)]
#
# Needs root, clang, bpftool, python3. Removes its cgroup, pins, netns and
# scratch files on exit, and puts kernel.bpf_stats_enabled back.
set -euo pipefail
n=${1:-20000}
[[ $n =~ ^[0-9]+$ ]] && ((n > 0 && n <= 1000000)) || { echo "stats-floor: CONNECTIONS must be 1..1000000, got '$n'" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "stats-floor: run as root (cgroups, BPF, netns)" >&2; exit 2; }
for t in clang bpftool python3 ip; do command -v $t >/dev/null || { echo "stats-floor: $t is not installed: run npm run setup" >&2; exit 2; }; done

# cgroup v2 wherever it is mounted (/sys/fs/cgroup or /sys/fs/cgroup/unified)
cg2=$(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") { if ($(i + 1) == "cgroup2") { print $5; exit } break } }' /proc/self/mountinfo)
[ -n "$cg2" ] || { echo "stats-floor: no cgroup v2 mount in /proc/self/mountinfo" >&2; exit 2; }
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

tag=meshcap-floor-$$
tmp=$(mktemp -d) cg=$cg2/$tag pins=/sys/fs/bpf/$tag ns=$tag
stats0=$(sysctl -n kernel.bpf_stats_enabled)
cleanup() {
  sysctl -qw kernel.bpf_stats_enabled="$stats0" || true
  if [ -d "$cg" ]; then
    bpftool cgroup detach "$cg" sock_ops pinned "$pins/floor_sockops" 2>/dev/null || true
    bpftool cgroup detach "$cg" connect4 pinned "$pins/floor_connect4" 2>/dev/null || true
    rmdir "$cg" || echo "stats-floor: could not remove the cgroup $cg" >&2
  fi
  rm -rf "$pins" "$tmp"
  ip netns del "$ns" 2>/dev/null || true
}
trap cleanup EXIT

cat >"$tmp/floor.bpf.c" <<'EOF'
#include <linux/bpf.h>
#define SEC(n) __attribute__((section(n), used))
char LICENSE[] SEC("license") = "GPL";
SEC("sockops") int floor_sockops(struct bpf_sock_ops *s) { return 1; }
SEC("cgroup/connect4") int floor_connect4(struct bpf_sock_addr *c) { return 1; }
EOF
clang -O2 -target bpf -I"/usr/include/$(uname -m)-linux-gnu" -c "$tmp/floor.bpf.c" -o "$tmp/floor.bpf.o"
mkdir "$cg"
bpftool prog loadall "$tmp/floor.bpf.o" "$pins"
bpftool cgroup attach "$cg" sock_ops pinned "$pins/floor_sockops" multi
bpftool cgroup attach "$cg" connect4 pinned "$pins/floor_connect4" multi
ip netns add "$ns"
ip -n "$ns" link set lo up

cat >"$tmp/tc.bpf.c" <<'EOF'
#include <linux/bpf.h>
#define SEC(n) __attribute__((section(n), used))
char LICENSE[] SEC("license") = "GPL";
SEC("tc") int floor_tc(struct __sk_buff *s) { return 0; }
EOF
clang -O2 -target bpf -I"/usr/include/$(uname -m)-linux-gnu" -c "$tmp/tc.bpf.c" -o "$tmp/tc.bpf.o"
bpftool prog load "$tmp/tc.bpf.o" "$pins/floor_tc" type classifier
head -c 64 /dev/zero >"$tmp/pkt"
for st in 0 1 0 1; do
  sysctl -qw kernel.bpf_stats_enabled=$st
  d=$(bpftool prog run pinned "$pins/floor_tc" data_in "$tmp/pkt" repeat 5000000 2>&1 | sed -n 's/.*duration (average): \([0-9]*\)ns.*/\1/p')
  [ -n "$d" ] || { echo "stats-floor: bpftool prog run gave no duration" >&2; exit 1; }
  echo "empty tc program, BPF_PROG_TEST_RUN x5,000,000, bpf_stats_enabled=$st: $d ns per run"
done

sysctl -qw kernel.bpf_stats_enabled=1
# One process in the scratch cgroup does both ends, so both sides' sockops run.
sh -c 'echo $$ > "$1/cgroup.procs"; exec ip netns exec "$2" python3 -c "
import socket, sys
n = int(sys.argv[1])
srv = socket.socket(); srv.bind((\"127.0.0.1\", 0)); srv.listen(128)
addr = srv.getsockname()
for _ in range(n):
    c = socket.socket(); c.connect(addr); a, _ = srv.accept(); a.close(); c.close()
" "$3"' _ "$cg" "$ns" "$n"
sysctl -qw kernel.bpf_stats_enabled="$stats0"

for p in floor_sockops floor_connect4; do
  bpftool -j prog show pinned "$pins/$p"
  echo
done | python3 -c '
import json, sys
n = int(sys.argv[1])
for line in sys.stdin:
    if not line.strip():
        continue
    p = json.loads(line)
    cnt, ns = p.get("run_cnt", 0), p.get("run_time_ns", 0)
    if not cnt:
        sys.exit(f"stats-floor: {p['"'"'name'"'"']} never ran: the connections did not run in the scratch cgroup")
    print(f"{p['"'"'name'"'"']:16s} {ns / cnt:7.1f} ns per run  ({cnt} runs, {cnt / n:.1f} per connection)")
' "$n"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
