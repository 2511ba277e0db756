#!/bin/bash
# The programs' time split by step (docs/bench-datapath.md, Round 4).
#   split.sh build NAME REV [instrument.py options]   objects of REV, instrumented, in build/ab/split-NAME
#   split.sh run NAME                                  one quick echo-leg crr bench with them; prints ns per step
# Needs root, bpftool, the repo built (npm run build: the bench loads the pod
# objects from build/bpf, which this copies beside the instrumented ones).
set -euo pipefail
cd "$(dirname "$0")/../../.."
cmd=${1:?build or run}; name=${2:?name}; dir=build/ab/split-$name
case $cmd in
build)
  rev=${3:?git revision}; shift 3
  rm -rf "$dir" "$dir-src" && mkdir -p "$dir-src"
  git archive "$rev" bpf | tar -x -C "$dir-src"
  python3 bench/datapath/split/instrument.py "$dir-src" "$@"
  make -s -C "$dir-src/bpf" OUT="$PWD/$dir" VMLINUX="$PWD/build/vmlinux.h" >/dev/null
  echo "$dir" ;;
run)
  cp build/bpf/inbound*.bpf.o "$dir/"   # the pod objects the bench loads from build/bpf must match these
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  node --import ./bench/lib/ts.mjs bench/datapath/main.ts --rounds 1 --seconds 3 --legs echo --tests crr --modes direct,ebpf \
    --bpf-stats crr --objects "$dir" >"$out/bench.txt" 2>&1 &
  pid=$!
  # The .bss maps live as long as the bench's programs: keep the last complete reading.
  while kill -0 $pid 2>/dev/null; do
    ids=$(bpftool -j map list | python3 -c 'import json,sys; print(" ".join(str(m["id"]) for m in json.load(sys.stdin) if m.get("name","").endswith(".bss") and m["name"].split(".")[0] in ("outbound","sockops","origdst")))')
    if [ -n "$ids" ]; then
      : >"$out/try"
      for id in $ids; do bpftool -j map dump id "$id" >>"$out/try" 2>/dev/null && echo >>"$out/try"; done
      grep -q error "$out/try" || mv "$out/try" "$out/bss"
    fi
    sleep 0.3
  done
  wait $pid || { cat "$out/bench.txt"; exit 1; }
  grep -E '^echo ' "$out/bench.txt"
  python3 - "$out/bss" <<'PY'
import json, struct, sys
tot = [0] * 16
for line in open(sys.argv[1]):
    if line.strip():
        for e in json.loads(line):
            raw = bytes(int(b, 16) for b in e['value'])
            for i, v in enumerate(struct.unpack('<%dQ' % (len(raw) // 8), raw)[:16]):
                tot[i] += v
for i, name in enumerate(['connect4 stats counter', 'mc_origdst update', 'mc_origdst lookup', 'mc_origdst delete',
                          'mc_skorig creation', 'getsockopt stats counter', 'empty lap (timer cost)', 'TCP option read']):
    ns, n = tot[2 * i], tot[2 * i + 1]
    print(f'{name:26s} {ns / n if n else 0:8.1f} ns  ({n} times)')
PY
  ;;
*) echo "split.sh build|run" >&2; exit 2 ;;
esac
