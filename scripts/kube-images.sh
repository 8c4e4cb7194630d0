#!/usr/bin/env bash
# Builds every image the Kubernetes test harness runs and pushes them to
# its registry (`make images`; docs/kube-harness.md, "Images"). No base
# image is pulled: each image is one layer made here from files of this
# machine, written by GNU tar with fixed owners, modes order and times, and
# turned into an image and pushed by crane (go-containerregistry, built by
# scripts/kube-build.sh). The same inputs give the same digests.
#
#   scripts/kube-images.sh            build and push to the harness registry
#   scripts/kube-images.sh --layers   only build the layers (no registry needed)
#
# Images, under the names the cluster pulls (the harness's containerd
# resolves docker.io, registry.k8s.io and ghcr.io to its registry):
#   ghcr.io/slipstream-mesh/slipstream:<version>-g<commit>   every role of slipstream
#   registry.k8s.io/pause:3.10                               pause, from Kubernetes' source
#   docker.io/istio/examples-bookinfo-*:1.20.2               bookinfo's six, served by slipstream's apps
#   docker.io/curlimages/curl:<Debian's curl version>         curl, sleep and sh from Debian
#   docker.io/mccutchen/go-httpbin:v2.15.0, docker.io/istio/examples-helloworld-v{1,2}:1.0
#                                                            slipstream's echo, as httpbin and helloworld
#   docker.io/fortio/fortio:<version> and :latest_release    the fortio scripts/setup.sh installed
#   docker.io/networkstatic/iperf3:<version>                 Debian's iperf3 (`slipstream bench --kubeconfig`)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
KUBE_CACHE=${SLIPSTREAM_KUBE_CACHE:-/var/tmp/slipstream-kube}
OUT=${SLIPSTREAM_KH_IMAGES:-$KUBE_CACHE/images}
REGISTRY=${SLIPSTREAM_KH_REGISTRY:-10.77.0.1:5000}
BIN=${SLIPSTREAM_BIN:-${CARGO_TARGET_DIR:-/var/tmp/slipstream-target}/release/slipstream}
KUBE_VERSION=${SLIPSTREAM_KUBE_VERSION:-v1.32.13}
PAUSE_VERSION=3.10
BOOKINFO_TAG=1.20.2
# Files of the image are dated at the commit, not at the build.
EPOCH=$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)

log() { echo "kube-images.sh: $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

layers_only=
FORTIO=$(command -v fortio || echo "${GOPATH:-$HOME/go}/bin/fortio")
[ "${1:-}" = "--layers" ] && layers_only=1

version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n 1)
commit=$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
SLIPSTREAM_TAG="$version-g$commit"

[ -x "$BIN" ] || die "$BIN is missing; build it first (make build)"
mkdir -p "$OUT"

# A deterministic layer from directory `$1` into `$2`: sorted names, one
# owner and date, no atime/ctime.
make_layer() {
  local dir=$1 out=$2
  find "$dir" -exec touch -h -d "@$EPOCH" {} +
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$EPOCH" \
    --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$dir" -cf "$out" .
}

# The shared libraries `$2` links (as ldd lists them) and its loader (where
# its PT_INTERP says), copied into root filesystem `$1`.
copy_libs() {
  local r=$1 exe=$2 lib interp
  ldd "$exe" | awk '/=> \// { print $3 } /^\t\// { print $1 }' | sort -u | while read -r lib; do
    mkdir -p "$r$(dirname "$lib")"
    cp -L "$lib" "$r$lib"
  done
  interp=$(readelf -l "$exe" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
  if [ -n "$interp" ] && [ ! -e "$r$interp" ]; then
    mkdir -p "$r$(dirname "$interp")"
    cp -L "$interp" "$r$interp"
  fi
}

# A new root filesystem `$1` with /etc/passwd and /etc/group of root and
# user `$2` (uid and gid `$3`), name-service order and a /tmp.
new_rootfs() {
  local r=$1 user=$2 id=$3
  rm -rf "$r"
  mkdir -p "$r/etc" "$r/tmp"
  chmod 1777 "$r/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\n%s:x:%s:%s:%s:/home/%s:/sbin/nologin\n' "$user" "$id" "$id" "$user" "$user" >"$r/etc/passwd"
  printf 'root:x:0:\n%s:x:%s:\n' "$user" "$id" >"$r/etc/group"
  printf 'hosts: files dns\n' >"$r/etc/nsswitch.conf"
}

# The slipstream image's files: the binary, its libraries, its users, /tmp,
# and Debian's `nft` and `ip` with their libraries: the node agent installs
# pods' capture with them (nftables rules and the reply route in each
# meshed pod's namespace, the probe table in the node's).
slipstream_rootfs() {
  local r="$OUT/slipstream-rootfs" exe
  new_rootfs "$r" nonroot 65532
  mkdir -p "$r/usr/local/bin"
  install -m 0755 "$BIN" "$r/usr/local/bin/slipstream"
  copy_libs "$r" "$BIN"
  for exe in /usr/sbin/nft /usr/sbin/ip; do
    [ -x "$exe" ] || die "$exe is missing; run scripts/setup.sh"
    mkdir -p "$r$(dirname "$exe")"
    cp -L "$exe" "$r$exe"
    copy_libs "$r" "$exe"
  done
  make_layer "$r" "$OUT/slipstream.tar"
}

# curlimages/curl's part that the samples use: curl, and sleep and sh for
# the samples that keep the pod alive to `kubectl exec` into it; Debian's
# programs with their libraries.
curl_rootfs() {
  local r="$OUT/curl-rootfs" exe
  new_rootfs "$r" curl_user 100
  for exe in /usr/bin/curl /bin/sleep /bin/sh; do
    mkdir -p "$r$(dirname "$exe")"
    cp -L "$exe" "$r$exe"
    copy_libs "$r" "$exe"
  done
  make_layer "$r" "$OUT/curl.tar"
}

# fortio/fortio's part: the fortio that scripts/setup.sh installed (the
# version BENCHMARKS.md pins), with its libraries.
fortio_rootfs() {
  local r="$OUT/fortio-rootfs" exe=$FORTIO
  [ -x "$exe" ] || die "fortio is missing; run scripts/setup.sh"
  new_rootfs "$r" fortio 65532
  mkdir -p "$r/usr/bin"
  cp -L "$exe" "$r/usr/bin/fortio"
  copy_libs "$r" "$exe"
  make_layer "$r" "$OUT/fortio.tar"
}

# networkstatic/iperf3's part: Debian's iperf3 and its libraries, for
# T1 and T2 of `slipstream bench --kubeconfig` (the pods run `iperf3 -s`).
iperf3_rootfs() {
  local r="$OUT/iperf3-rootfs" exe=/usr/bin/iperf3
  [ -x "$exe" ] || die "$exe is missing; run scripts/setup.sh"
  new_rootfs "$r" iperf 65532
  mkdir -p "$r/usr/bin"
  cp -L "$exe" "$r$exe"
  copy_libs "$r" "$exe"
  make_layer "$r" "$OUT/iperf3.tar"
}

# pause, from build/pause/linux/pause.c of the k8s.io/kubernetes module.
pause_rootfs() {
  local src
  src="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go env GOMODCACHE)/k8s.io/kubernetes@$KUBE_VERSION/build/pause/linux/pause.c"
  if [ ! -f "$src" ]; then
    (cd /tmp && GOTOOLCHAIN=local go mod download "k8s.io/kubernetes@$KUBE_VERSION") >/dev/null
  fi
  [ -f "$src" ] || die "pause.c not found at $src"
  local r="$OUT/pause-rootfs"
  rm -rf "$r"
  mkdir -p "$r"
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-slipstream" -o "$r/pause" "$src"
  strip "$r/pause"
  make_layer "$r" "$OUT/pause.tar"
}

slipstream_rootfs
pause_rootfs
curl_rootfs
fortio_rootfs
iperf3_rootfs
for l in slipstream pause curl fortio iperf3; do
  log "layer $l.tar: sha256:$(sha256sum "$OUT/$l.tar" | cut -d' ' -f1)"
done
if [ -n "$layers_only" ]; then
  echo "$OUT"
  exit 0
fi

CRANE="$("$ROOT/scripts/kube-build.sh" crane | tail -n 1)/crane"
curl -sf "http://$REGISTRY/v2/" >/dev/null || die "no registry at $REGISTRY (scripts/kube-cluster.sh up starts it)"

# Pushes layer `$1` as `$2` (registry path and tag), its configuration set
# by the crane mutate flags that follow. Prints the digest.
push() {
  local layer=$1 ref="$REGISTRY/$2"
  shift 2
  local out
  out=$("$CRANE" append --insecure --platform linux/amd64 --oci-empty-base -f "$layer" -t "$ref" 2>&1) ||
    die "crane append $ref: $out"
  out=$("$CRANE" mutate --insecure "$ref" --set-platform linux/amd64 "$@" -t "$ref" 2>&1) ||
    die "crane mutate $ref: $out"
  "$CRANE" digest --insecure "$ref"
}

S=/usr/local/bin/slipstream
digest=$(push "$OUT/slipstream.tar" "slipstream-mesh/slipstream:$SLIPSTREAM_TAG" \
  --entrypoint "$S" --user 65532:65532 --workdir /)
log "ghcr.io/slipstream-mesh/slipstream:$SLIPSTREAM_TAG $digest"
digest=$(push "$OUT/pause.tar" "pause:$PAUSE_VERSION" --entrypoint /pause --user 65535:65535)
log "registry.k8s.io/pause:$PAUSE_VERSION $digest"
for app in details-v1 ratings-v1 reviews-v1 reviews-v2 reviews-v3 productpage-v1; do
  role=${app%-v*}
  v=${app##*-}
  digest=$(push "$OUT/slipstream.tar" "istio/examples-bookinfo-$app:$BOOKINFO_TAG" \
    --entrypoint "$S,app,bookinfo,--role,$role,--version,$v" --user 65532:65532 --workdir /)
  log "docker.io/istio/examples-bookinfo-$app:$BOOKINFO_TAG $digest"
done
# Istio's httpbin and helloworld samples, served by slipstream's echo
# (docs/images.md).
digest=$(push "$OUT/slipstream.tar" "mccutchen/go-httpbin:v2.15.0" \
  --entrypoint "$S,app,echo,--http-port,8080,--tcp-port,0" --user 65532:65532 --workdir /)
log "docker.io/mccutchen/go-httpbin:v2.15.0 $digest"
for v in v1 v2; do
  digest=$(push "$OUT/slipstream.tar" "istio/examples-helloworld-$v:1.0" \
    --entrypoint "$S,app,echo,--http-port,5000,--tcp-port,0,--hello-version,$v" --user 65532:65532 --workdir /)
  log "docker.io/istio/examples-helloworld-$v:1.0 $digest"
done
FORTIO_TAG=$("$FORTIO" version 2>/dev/null | head -n 1 | awk '{print $1}' || true)
for t in ${FORTIO_TAG:+$FORTIO_TAG} latest_release; do
  digest=$(push "$OUT/fortio.tar" "fortio/fortio:$t" --entrypoint /usr/bin/fortio --cmd server --user 65532:65532 --workdir /)
  log "docker.io/fortio/fortio:$t $digest"
done
CURL_TAG=$(dpkg-query -W -f='${Version}' curl | sed 's/[-+~].*//')
digest=$(push "$OUT/curl.tar" "curlimages/curl:$CURL_TAG" --entrypoint /usr/bin/curl --user 100:100 --workdir /)
log "docker.io/curlimages/curl:$CURL_TAG $digest"
# Tagged with Debian's version, as curl is (never `latest`).
IPERF_TAG=$(dpkg-query -W -f='${Version}' iperf3 | sed 's/[-+~].*//')
digest=$(push "$OUT/iperf3.tar" "networkstatic/iperf3:$IPERF_TAG" --entrypoint /usr/bin/iperf3 --cmd -s --user 65532:65532 --workdir /)
log "docker.io/networkstatic/iperf3:$IPERF_TAG $digest"
echo "$SLIPSTREAM_TAG"
