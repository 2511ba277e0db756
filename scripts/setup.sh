#!/usr/bin/env bash
# One idempotent setup: Debian packages, npm dependencies, BPF objects, the
# native addon and CNI binary, the TypeScript. A second run with nothing
# changed does no installs and no rebuilds.
set -euo pipefail
cd "$(dirname "$0")/.."

# Everything the build, the tests and the sandbox need from Debian.
# (package -> why) kept in one list so setup and the README agree.
PKGS=(
  clang llvm            # BPF C -> .bpf.o (clang -target bpf), llvm-strip
  libclang-rt-14-dev    # libFuzzer + ASan/UBSan runtimes for the forwarder's fuzz harnesses (scripts/fuzz-cni.mjs)
  libbpf-dev            # libbpf headers + static/shared lib for the addon
  bpftool               # vmlinux.h generation, independent observer in tests
  libelf-dev zlib1g-dev # libbpf link deps
  cmake make g++ pkg-config
  libjansson-dev        # JSON in the static CNI forwarder
  iptables iproute2     # fallback datapath, netns plumbing
  socat haproxy         # haproxy: unmodified third-party SO_ORIGINAL_DST proxy in tests
  gnuplot-nox           # bench:datapath plot (docs/img); its load generator is C, built by cc from g++'s deps

  debootstrap           # scripts/build-images.sh: the Debian trixie base of the images (no registry)
  podman runc containernetworking-plugins  # sandbox: real runtime, CNI backend (bridge + host-local); runc as crun fails on hybrid cgroups
  util-linux            # setpriv/unshare/nsenter
  python3               # SO_ORIGINAL_DST listener in the iptables traffic test
  procps psmisc
  openssl               # per-run certificates of the test control plane (test/helpers/k8s-control-plane.ts)
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  if [ "$(id -u)" != 0 ]; then echo "setup: need root to apt-get install ${missing[*]}" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm ci only when the lockfile changed since the last install.
stamp=node_modules/.meshcap-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" > "$stamp"
fi

node scripts/build.mjs

# etcd, etcdctl and kube-apiserver from their Go modules into build/k8s/bin/
# for the real-API-server tests (test/k8s/); nothing when already built at the
# pinned versions, about 10 minutes the first time (docs/kubernetes-e2e.md)
bash scripts/build-k8s.sh

# istio-iptables and istio-cni from one pinned istio.io/istio into build/istio/
# for the differential tests against the real Istio (docs/istio-compat.md);
# nothing when already built, about 6 minutes the first time
bash scripts/build-peers.sh

# helm and kustomize from their Go modules into build/helm/bin/ for the chart
# tests (test/k8s/deploy-chart.test.ts, deploy-manifests.test.ts); nothing when
# already built, about 4 minutes the first time
bash scripts/build-helm.sh
