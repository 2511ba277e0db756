#!/bin/sh
# Runs inside a test VM (see test/kernels/run.mjs): proves the guest is fit to
# run meshcap's tests before they run — right kernel, node, bpffs, cgroup2,
# bpftool, iproute2 and iptables in a network namespace. Exits non-zero with
# the failing check named.
set -eu
check() { echo "smoke: $*"; }
die() { echo "smoke: FAILED: $*"; exit 1; }

[ "$(uname -r)" = "${EXPECT_RELEASE:?}" ] || die "uname -r is $(uname -r), expected $EXPECT_RELEASE"
check "kernel $(uname -r)"

node -e 'const os = require("node:os"); console.log(`smoke: node ${process.version} on ${os.release()}, ${os.cpus().length} cpus`)' ||
	die "node does not run in the guest"

grep -q ' /sys/fs/bpf bpf ' /proc/self/mounts || die "bpffs is not mounted at /sys/fs/bpf"
cg=$(awk '$9 == "cgroup2" { print $5; exit }' /proc/self/mountinfo)
[ -n "$cg" ] || die "no cgroup2 mount in /proc/self/mountinfo"
check "bpffs at /sys/fs/bpf, cgroup2 at $cg"
mkdir "$cg/meshcap-smoke-$$" && rmdir "$cg/meshcap-smoke-$$" || die "cannot make a child cgroup under $cg"

# One probe run: it loads hundreds of programs, seconds each under emulation.
bpftool feature probe kernel >/tmp/smoke-probe.txt 2>&1 || die "bpftool feature probe kernel failed: $(tail -3 /tmp/smoke-probe.txt)"
grep -E 'program_type (cgroup_sock_addr|sk_lookup|sock_ops|sk_msg) ' /tmp/smoke-probe.txt || true

ip -br link show lo | grep -q UP || die "lo is not up"

ns="meshcap-smoke-$$"
cleanup() { ip netns del "$ns" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$ns"
ip -n "$ns" link set lo up
ip -n "$ns" link add mcs0 type veth peer name mcs1 || die "veth pair in $ns (module veth)"
ip -n "$ns" addr add 198.18.0.1/24 dev mcs0
ip -n "$ns" link set mcs0 up
ip -n "$ns" link set mcs1 up
ip -n "$ns" -br addr show mcs0

ip netns exec "$ns" iptables-restore <<'RULES' || die "iptables-restore in netns $ns"
*nat
:MESHCAP_SMOKE - [0:0]
-A OUTPUT -p tcp -j MESHCAP_SMOKE
-A MESHCAP_SMOKE -d 198.18.0.2/32 -p tcp -m owner ! --uid-owner 1337 -j REDIRECT --to-ports 15001
COMMIT
RULES
ip netns exec "$ns" iptables-save -t nat | grep -q -- '--to-ports 15001' || die "rule not in iptables-save of $ns"
ip netns exec "$ns" ip6tables-restore <<'RULES' || die "ip6tables-restore in netns $ns"
*nat
-A OUTPUT -d 2001:db8::2/128 -p tcp -j REDIRECT --to-ports 15001
COMMIT
RULES
check "iptables-restore / ip6tables-restore in netns $ns ok ($(iptables --version))"
echo "smoke: ok"
