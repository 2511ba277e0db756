#!/usr/bin/env bash
# Builds meshcap's container images without a registry and writes each as an
# OCI archive containerd imports (`ctr -n k8s.io images import FILE`):
#   build/images/meshcap.tar  localhost/meshcap:dev          deploy/Containerfile
#   build/images/app.tar      localhost/meshcap-app:dev      test/images/app/
#   build/images/sidecar.tar  localhost/meshcap-sidecar:dev  test/images/sidecar/
#   build/images/pause.tar    localhost/pause:3.10.2         test/images/pause/
# The base of the Debian images, localhost/meshcap-base:trixie, is made here by
# debootstrap (variant minbase) and `podman import`ed: nothing is pulled.
#
# The images are built from the committed HEAD (`git archive` of the input
# paths into build/images/context/): the work tree is shared by people editing
# it, and an image says exactly which commit it is. --worktree builds the
# files as they are in the work tree instead (labelled dirty when they differ).
#
# Everything podman keeps lives in a private store under build/images/ (the
# host's podman store and configuration are never touched). Each archive has a
# stamp: the sha256 of its inputs (git object ids or file contents, and the
# recipe); with every stamp matching and every archive present the script does
# nothing. See docs/images.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

KUBERNETES_VERSION=v1.37.2 # the pause.c source; the same release scripts/build-k8s.sh builds
PAUSE_TAG=3.10.2           # build/pause/Makefile TAG of that release
SUITE=trixie               # Node 20 (bookworm has 18)
MIRROR=http://deb.debian.org/debian
# bump when this script changes how an image is made
RECIPE=2

out=$root/build/images
mkdir -p "$out"
say() { echo "build-images: $*"; }
die() { echo "build-images: error: $*" >&2; exit 1; }

# what the images are made of (the meshcap context is what .containerignore
# lets through)
MESHCAP_INPUTS=(package.json package-lock.json tsconfig.json bin bpf native src scripts/build.mjs
  bench/datapath/mc-order-check.c deploy/Containerfile .containerignore)
INPUTS=("${MESHCAP_INPUTS[@]}" test/images)

from=head
case "${1:-}" in
  --worktree) from=worktree ;;
  "") ;;
  *) die "usage: scripts/build-images.sh [--worktree]  (default: build from the committed HEAD)" ;;
esac
if [ "$from" = head ] && ! git rev-parse --verify -q HEAD >/dev/null 2>&1; then
  say "no git commit here: building the work tree as it is"
  from=worktree
fi

# --- stamps: cheap, so an unchanged tree returns at once -------------------
if [ "$from" = head ]; then
  commit=$(git rev-parse HEAD)
  hash_paths() { git ls-tree -r "$commit" -- "$@" | sha256sum | cut -c1-64; }
else
  hash_paths() { # sha256 over the listed files/dirs (names and contents)
    (cd "$root" && find "$@" -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-64
  }
fi
base_recipe="recipe=$RECIPE suite=$SUITE mirror=$MIRROR"
declare -A want
want[base]=$(echo "$base_recipe" | sha256sum | cut -c1-64)
# the context .containerignore lets through, plus the Containerfile
want[meshcap]=$(echo "${want[base]} $(hash_paths "${MESHCAP_INPUTS[@]}")" | sha256sum | cut -c1-64)
want[sidecar]=$(echo "${want[meshcap]} $(hash_paths test/images/sidecar)" | sha256sum | cut -c1-64)
want[app]=$(echo "recipe=$RECIPE $(hash_paths test/images/app)" | sha256sum | cut -c1-64)
want[pause]=$(echo "recipe=$RECIPE k8s=$KUBERNETES_VERSION tag=$PAUSE_TAG $(hash_paths test/images/pause)" | sha256sum | cut -c1-64)

declare -A ref=(
  [base]=localhost/meshcap-base:$SUITE
  [meshcap]=localhost/meshcap:dev
  [app]=localhost/meshcap-app:dev
  [sidecar]=localhost/meshcap-sidecar:dev
  [pause]=localhost/pause:$PAUSE_TAG
)
IMAGES=(meshcap app sidecar pause)
current() { [ -f "$out/$1.stamp" ] && [ "$(cat "$out/$1.stamp")" = "${want[$1]}" ] && { [ "$1" = base ] || [ -s "$out/$1.tar" ]; }; }
up_to_date() {
  for i in "${IMAGES[@]}"; do current "$i" || return 1; done
  for i in "${IMAGES[@]}"; do say "$i.tar ${ref[$i]} up to date ($(du -h "$out/$i.tar" | cut -f1))"; done
}
up_to_date && exit 0

# --- a private podman ------------------------------------------------------
for t in podman debootstrap gcc tar; do
  command -v "$t" >/dev/null || die "$t not found (npm run setup installs it: scripts/setup.sh)"
done
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, podman with a private store)"
exec 9>"$out/.lock"
flock -n 9 || { say "another build-images run holds $out/.lock; waiting"; flock 9; up_to_date && exit 0; }

store=$out/storage
runroot=/run/meshcap-images/$(echo "$root" | sha256sum | cut -c1-12)
mkdir -p "$store" "$runroot" "$out/tmp"
cat >"$out/containers.conf" <<EOF
# written by scripts/build-images.sh: podman reads only this file (CONTAINERS_CONF)
[containers]
# podman's default (the host's hard limit) is refused by runc here
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$out/tmp/podman-events.log"
tmp_dir = "$out/tmp"
lock_type = "file"
EOF
export CONTAINERS_CONF=$out/containers.conf TMPDIR=$out/tmp
pm() { podman --root "$store" --runroot "$runroot" --storage-driver overlay "$@"; }

work=
cleanup() {
  local rc=$?
  if [ -n "$work" ] && [ -d "$work" ]; then
    # debootstrap mounts proc/sys/dev inside the target; a failed run leaves them
    findmnt -rn -o TARGET | grep -F "$work/" | sort -r | while read -r m; do umount -l "$m" || true; done
    rm -rf --one-file-system "$work"
  fi
  # build containers podman kept after a failure or an interrupt
  pm ps -a -q --external 2>/dev/null | while read -r c; do pm rm -f "$c" >/dev/null 2>&1 || true; done
  rm -f "$out"/*.tar.tmp
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

secs() { echo $(($(date +%s) - $1)); }
stamp() { echo "${want[$1]}" >"$out/$1.stamp"; }

# an OCI archive whose manifest names the image for containerd: `ctr import`
# takes the name from io.containerd.image.name (an OCI ref.name alone is only
# a tag, which ctr drops without --base-name)
save() { # image-key
  local name=$1 r=${ref[$1]} tmpd
  tmpd=$(mktemp -d "$out/tmp/save.XXXXXX")
  pm save -q --format oci-archive -o "$tmpd/img.tar" "$r" >/dev/null
  mkdir "$tmpd/x" && tar -C "$tmpd/x" -xf "$tmpd/img.tar"
  node -e '
    const fs = require("fs"); const [file, name] = process.argv.slice(1);
    const idx = JSON.parse(fs.readFileSync(file, "utf8"));
    if (idx.manifests.length !== 1) throw new Error(`expected one manifest in ${file}, got ${idx.manifests.length}`);
    const tag = name.slice(name.lastIndexOf(":") + 1);
    idx.manifests[0].annotations = { ...idx.manifests[0].annotations, "io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag };
    fs.writeFileSync(file, JSON.stringify(idx));' "$tmpd/x/index.json" "$r"
  tar -C "$tmpd/x" --sort=name --owner=0 --group=0 --numeric-owner -cf "$out/$name.tar.tmp" .
  mv "$out/$name.tar.tmp" "$out/$name.tar"
  rm -rf "$tmpd"
  stamp "$name"
  say "$name.tar ${r} $(du -h "$out/$name.tar" | cut -f1) (image $(pm image inspect --format '{{.Size}}' "$r" | numfmt --to=iec))"
}

# an image the next build starts FROM: in the store, or loaded from its archive
have() { # image-key
  pm image exists "${ref[$1]}" && return 0
  [ -s "$out/$1.tar" ] && current "$1" || return 1
  pm load -q -i "$out/$1.tar" >/dev/null && pm image exists "${ref[$1]}"
}

# --- the build context ----------------------------------------------------
if [ "$from" = head ]; then
  ctx=$out/context
  rm -rf "$ctx" && mkdir -p "$ctx"
  git archive --format=tar "$commit" -- "${INPUTS[@]}" | tar -x -C "$ctx" ||
    die "git archive $commit of the image inputs failed"
  dirty=
  say "building from commit $commit (the work tree's uncommitted changes are not in the images; --worktree builds them)"
else
  ctx=$root
  commit=$(git rev-parse HEAD 2>/dev/null || true)
  dirty=$([ -n "$commit" ] && [ -n "$(git status --porcelain --untracked-files=no -- "${INPUTS[@]}" 2>/dev/null)" ] && echo 1 || true)
  say "building from the work tree${dirty:+ (uncommitted changes: labelled dirty)}"
fi

# --- base: debootstrap minbase trixie -> podman import ---------------------
if ! current base || ! pm image exists "${ref[base]}"; then
  t0=$(date +%s)
  say "base ${ref[base]}: debootstrap --variant=minbase $SUITE from $MIRROR (a few minutes the first time)"
  work=$(mktemp -d "$out/tmp/rootfs.XXXXXX")
  debootstrap --variant=minbase "$SUITE" "$work/rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; die "debootstrap $SUITE failed (log above); is $MIRROR reachable?"; }
  cat >"$work/rootfs/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb ${MIRROR%/debian}/debian-security $SUITE-security main
EOF
  # what debootstrap leaves that an image does not need, and no docs, man
  # pages or translations from later installs either (as debian:*-slim does)
  printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
    'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' 'path-exclude /usr/share/lintian/*' \
    'path-exclude /usr/share/locale/*' 'path-include /usr/share/locale/locale.alias' \
    >"$work/rootfs/etc/dpkg/dpkg.cfg.d/meshcap-slim"
  find "$work/rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$work/rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  rm -rf "$work"/rootfs/usr/share/man/* "$work"/rootfs/usr/share/info/* "$work"/rootfs/usr/share/lintian/*
  rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/* "$work"/rootfs/var/log/* "$work"/rootfs/debootstrap
  tar -C "$work/rootfs" --numeric-owner -c . | pm import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' -q - "${ref[base]}" >/dev/null
  rm -rf --one-file-system "$work"; work=
  stamp base
  say "base ${ref[base]} $(pm image inspect --format '{{.Size}}' "${ref[base]}" | numfmt --to=iec) in $(secs "$t0") s"
fi

build() { # image-key, podman build args...
  local name=$1; shift
  local t0; t0=$(date +%s)
  say "$name ${ref[$name]}: podman build $*"
  pm build --network host --pull=never --layers --force-rm -t "${ref[$name]}" "$@" >"$out/$name.build.log" 2>&1 ||
    { tail -40 "$out/$name.build.log" >&2; die "building ${ref[$name]} failed (the end of $out/$name.build.log is above)"; }
  save "$name"
  say "$name built in $(secs "$t0") s"
}

# --- meshcap: deploy/Containerfile ------------------------------------------
if ! current meshcap || ! have meshcap; then
  # the CA bundle this host reaches the npm registry with, mounted read-only
  # into the build's RUN steps (no layer keeps it): hosts behind a TLS proxy
  ca=${MESHCAP_BUILD_CA:-${NODE_EXTRA_CA_CERTS:-$(npm config get cafile 2>/dev/null || true)}}
  ca_args=()
  if [ -n "$ca" ] && [ -f "$ca" ]; then ca_args=(-v "$(realpath "$ca"):/run/meshcap-build-ca.crt:ro" --build-arg BUILD_CA=/run/meshcap-build-ca.crt); fi
  # the compile and runtime-base stages get their own tags so pruning
  # dangling images keeps their layers (apt, npm ci) as the next build's
  # cache; the sidecar starts from runtime-base. The full build reuses them.
  for stage in compile runtime-base; do
    say "meshcap: $stage stage"
    pm build --network host --pull=never --layers --force-rm --target "$stage" -t "localhost/meshcap-$stage:dev" \
      "${ca_args[@]}" -f "$ctx/deploy/Containerfile" --build-arg BASE="${ref[base]}" \
      --build-arg MESHCAP_BUILD_COMMIT="$commit" --build-arg MESHCAP_BUILD_DIRTY="$dirty" "$ctx" >"$out/meshcap-$stage.build.log" 2>&1 ||
      { tail -40 "$out/meshcap-$stage.build.log" >&2; die "the $stage stage of deploy/Containerfile failed (the end of $out/meshcap-$stage.build.log is above)"; }
  done
  build meshcap "${ca_args[@]}" -f "$ctx/deploy/Containerfile" --build-arg BASE="${ref[base]}" \
    --build-arg MESHCAP_BUILD_COMMIT="$commit" --build-arg MESHCAP_BUILD_DIRTY="$dirty" "$ctx"
fi

# --- sidecar: meshcap's runtime packages + haproxy + /opt/meshcap, uid 1337 ---
if ! current sidecar; then
  have meshcap || die "${ref[meshcap]} is neither in the store nor in $out/meshcap.tar"
  pm image exists localhost/meshcap-runtime-base:dev ||
    die "localhost/meshcap-runtime-base:dev is missing from the store: rm $out/meshcap.stamp and run again"
  build sidecar -f "$ctx/test/images/sidecar/Containerfile" --build-arg BASE=localhost/meshcap-runtime-base:dev \
    --build-arg MESHCAP="${ref[meshcap]}" "$ctx/test/images/sidecar"
fi

# --- app: a static C program, FROM scratch ------------------------------------
if ! current app; then
  mkdir -p "$out/app"
  gcc -Os -Wall -Wextra -Werror -static -o "$out/app/meshcap-app" "$ctx/test/images/app/app.c" ||
    die "compiling test/images/app/app.c failed"
  strip "$out/app/meshcap-app"
  cp "$ctx/test/images/app/Containerfile" "$out/app/Containerfile"
  build app -f "$out/app/Containerfile" "$out/app"
fi

# --- pause: k8s.io/kubernetes' build/pause/linux/pause.c, static, FROM scratch -
if ! current pause; then
  command -v go >/dev/null || die "go not found: the pause source comes from the k8s.io/kubernetes Go module"
  kdir=$(GOMODCACHE=$root/build/k8s/gomodcache GOFLAGS=-mod=mod GOTOOLCHAIN=local GOWORK=off \
    go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -f "$kdir/build/pause/linux/pause.c" ] || die "k8s.io/kubernetes@$KUBERNETES_VERSION has no build/pause/linux/pause.c (module dir: ${kdir:-not downloaded})"
  mkdir -p "$out/pause"
  # the flags of build/pause/Makefile
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_TAG-$KUBERNETES_VERSION" -o "$out/pause/pause" "$kdir/build/pause/linux/pause.c" ||
    die "compiling pause.c failed"
  strip "$out/pause/pause"
  cp "$ctx/test/images/pause/Containerfile" "$out/pause/Containerfile"
  build pause -f "$out/pause/Containerfile" "$out/pause"
fi

# layers no image refers to any more (earlier builds); the tagged images and
# their layers stay as the cache of the next build
pm image prune -f >/dev/null
for i in "${IMAGES[@]}"; do say "$i.tar ${ref[$i]} $(du -h "$out/$i.tar" | cut -f1)"; done
