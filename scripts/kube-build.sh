#!/usr/bin/env bash
# Builds the upstream programs of the Kubernetes test harness from their Go
# modules and prints the directory that holds them on the last line of
# stdout. Test infrastructure, not the product (docs/kube-harness.md).
#
#   scripts/kube-build.sh [PROGRAM...]     (default: all of them)
#
# Programs, each built once per version into $KUBE_CACHE/bin/<name>-<version>
# with a symlink <name> beside it for the version this script pins:
#   kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy
#   kubectl      from k8s.io/kubernetes (KUBE_VERSION)
#   coredns      from github.com/coredns/coredns (COREDNS_VERSION)
#   helm         from helm.sh/helm/v3 (HELM_VERSION); helm4 from helm.sh/helm/v4
#   crane        from github.com/google/go-containerregistry (CRANE_VERSION):
#                writes and pushes the images of `make images`
#
# Why builds: Debian packages none of them, and the module proxy is the
# only source this machine reaches (DESIGN.md, Kubernetes).
#
# How, for Kubernetes: k8s.io/kubernetes cannot be built with a plain
# `go install`, because its go.mod replaces every k8s.io/* staging module
# (k8s.io/api, apiserver, client-go, ...) with a directory of its own
# repository, and replace lines only count in the main module. So this
# script writes a small main module of its own (in $KUBE_CACHE/src, outside
# the clone) that requires k8s.io/kubernetes and replaces each staging
# module with its published v0.<minor>.<patch> release, then builds the
# commands from it. The others are plain `go build` of their modules in a
# main module of their own each.
#
# Idempotent: a program already built is not built again. The first build
# of everything takes about 40 minutes on two cores (kube-apiserver alone
# 10-15); Go's module and build caches (in their default places) keep most
# of it afterwards. Concurrent runs wait for one another on a lock. All
# builds run at nice 19 with CGO disabled (static binaries).
set -euo pipefail

KUBE_VERSION=${SLIPSTREAM_KUBE_VERSION:-v1.32.13}
COREDNS_VERSION=${SLIPSTREAM_COREDNS_VERSION:-v1.14.7}
HELM_VERSION=${SLIPSTREAM_HELM_VERSION:-v3.22.0}
HELM4_VERSION=${SLIPSTREAM_HELM4_VERSION:-v4.3.1}
CRANE_VERSION=${SLIPSTREAM_CRANE_VERSION:-v0.22.1}
KUBE_CACHE=${SLIPSTREAM_KUBE_CACHE:-/var/tmp/slipstream-kube}
BIN_DIR="$KUBE_CACHE/bin"
KUBE_PROGRAMS="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"
ALL="$KUBE_PROGRAMS coredns helm helm4 crane"

log() { echo "kube-build.sh: $*" >&2; }

version_of() {
  case "$1" in
    kube-*|kubelet|kubectl) echo "$KUBE_VERSION" ;;
    coredns) echo "$COREDNS_VERSION" ;;
    helm) echo "$HELM_VERSION" ;;
    helm4) echo "$HELM4_VERSION" ;;
    crane) echo "$CRANE_VERSION" ;;
    *) return 1 ;;
  esac
}

wanted=${*:-$ALL}
for p in $wanted; do
  if ! version_of "$p" >/dev/null; then
    log "ERROR: unknown program '$p' (known: $ALL)"
    exit 2
  fi
done

missing=""
for p in $wanted; do
  [ -x "$BIN_DIR/$p-$(version_of "$p")" ] || missing="$missing $p"
done

link_all() {
  for p in $wanted; do
    ln -sfn "$p-$(version_of "$p")" "$BIN_DIR/$p"
  done
}

if [ -z "$missing" ]; then
  link_all
  echo "$BIN_DIR"
  exit 0
fi

GO=$(command -v go || true)
if [ -z "$GO" ] && [ -x /usr/local/go/bin/go ]; then
  GO=/usr/local/go/bin/go
fi
if [ -z "$GO" ]; then
  log "ERROR: go not found (neither on PATH nor /usr/local/go/bin/go)."
  log "  The Kubernetes harness is built from source and needs Go 1.23 or later: https://go.dev/doc/install"
  exit 1
fi

mkdir -p "$BIN_DIR" "$KUBE_CACHE/src"
exec 9>"$KUBE_CACHE/.lock"
if ! flock -n 9; then
  log "another build is running; waiting for it"
  flock 9
fi

# The toolchain installed here, never one downloaded on the fly; a fixed
# module mode whatever the caller's environment says.
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

# Builds `$1` (the program's name) from package `$2` inside main module
# directory `$3`, with linker flags `$4`.
build_into() {
  local name=$1 pkg=$2 dir=$3 ldflags=$4
  local out
  out="$BIN_DIR/$name-$(version_of "$name")"
  [ -x "$out" ] && return 0
  local start tmp
  start=$(date +%s)
  tmp="$out.tmp.$$"
  log "compiling $pkg as $name (nice 19)"
  (cd "$dir" && nice -n 19 "$GO" build -trimpath -ldflags "$ldflags" -o "$tmp" "$pkg")
  mv "$tmp" "$out"
  log "built $out in $(($(date +%s) - start))s"
}

# Kubernetes: one main module for all six commands.
kube_wanted=""
for p in $missing; do
  case " $KUBE_PROGRAMS " in *" $p "*) kube_wanted="$kube_wanted $p" ;; esac
done
if [ -n "$kube_wanted" ]; then
  STAGING_VERSION="v0.${KUBE_VERSION#v1.}"
  log "building$kube_wanted $KUBE_VERSION with $("$GO" version | cut -d' ' -f3)"
  kube_mod=$("$GO" mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
  if [ -z "$kube_mod" ] || [ ! -f "$kube_mod" ]; then
    log "ERROR: could not download k8s.io/kubernetes@$KUBE_VERSION (is GOPROXY reachable?)"
    exit 1
  fi
  # Every `k8s.io/x => ./staging/...` replacement, in block or one-line form.
  staging=$(sed -n 's#^[[:space:]]*\(replace[[:space:]]\{1,\}\)\{0,1\}\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\2#p' "$kube_mod")
  if [ -z "$staging" ]; then
    log "ERROR: found no staging replacements in $kube_mod; the layout of kubernetes' go.mod changed"
    exit 1
  fi
  # The module proxy serves most staging modules at v0.<minor>.<patch> but
  # refuses some (k8s.io/endpointslice v0.32.13, for one): those get the newest release of the same minor it serves below
  # that patch (bug fixes apart, one API), and the build says so.
  staging_version() {
    local m=$1
    if "$GO" mod download "$m@$STAGING_VERSION" >/dev/null 2>&1; then
      echo "$STAGING_VERSION"
      return
    fi
    local minor=${STAGING_VERSION%.*} patch=${STAGING_VERSION##*.} v best=""
    for v in $("$GO" list -m -versions "$m" 2>/dev/null | tr ' ' '\n' | grep -E "^${minor//./\\.}\\.[0-9]+$" | sort -V); do
      [ "${v##*.}" -le "$patch" ] && best=$v
    done
    for v in $best; do
      if "$GO" mod download "$m@$v" >/dev/null 2>&1; then
        log "  $m: $STAGING_VERSION is not served; using $v"
        echo "$v"
        return
      fi
    done
    # None: left out; only the examples (k8s.io/sample-*) are missing so,
    # and no command links them (one that did would fail naming it).
    log "  $m: no ${minor}.x release up to $STAGING_VERSION is served; left out"
  }
  src="$KUBE_CACHE/src/kubernetes-$KUBE_VERSION"
  mkdir -p "$src"
  if [ ! -f "$src/go.mod" ]; then
    {
      echo "// Generated by slipstream scripts/kube-build.sh."
      echo "module slipstream.local/kubernetes"
      echo
      # The same language version and GODEBUG defaults as the upstream build.
      grep -E '^(go|godebug) ' "$kube_mod"
      echo
      echo "require k8s.io/kubernetes $KUBE_VERSION"
      echo
      echo "replace ("
      for m in $staging; do
        v=$(staging_version "$m")
        [ -n "$v" ] && echo "	$m => $m $v"
      done
      echo ")"
    } >"$src/go.mod.new"
    mv "$src/go.mod.new" "$src/go.mod"
  fi
  # What upstream's hack/lib/version.sh stamps in, so that --version and
  # /version answer with the real version instead of v0.0.0-master. No
  # build date: two builds of one version are the same bytes.
  pkg=k8s.io/component-base/version
  minor=${KUBE_VERSION#v1.}
  minor=${minor%%.*}
  ldflags="-s -w -buildid= -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  # No `go mod tidy`: it would also fetch the modules that only tests of
  # dependencies import, and the proxy refuses some of those (for example
  # k8s.io/csi-translation-lib v0.32.13). `go build` with -mod=mod fetches
  # just what each command links and records it in go.mod and go.sum.
  for p in $kube_wanted; do
    case $p in
      kubectl) build_into "$p" k8s.io/kubernetes/cmd/kubectl "$src" "$ldflags" ;;
      *) build_into "$p" "k8s.io/kubernetes/cmd/$p" "$src" "$ldflags" ;;
    esac
  done
fi

# A main module requiring `$2@$3`, to build package `$4` as `$1`.
build_module() {
  local name=$1 module=$2 version=$3 pkg=$4 ldflags=${5:-"-s -w -buildid="}
  local src="$KUBE_CACHE/src/$name-$version"
  mkdir -p "$src"
  if [ ! -f "$src/go.mod" ]; then
    # Downloaded from outside any module (the cache's root has no go.mod).
    local mod
    mod=$(cd "$KUBE_CACHE" && "$GO" mod download -json "$module@$version" |
      sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
    if [ -z "$mod" ] || [ ! -f "$mod" ]; then
      log "ERROR: could not download $module@$version (is GOPROXY reachable?)"
      exit 1
    fi
    {
      printf '// Generated by slipstream scripts/kube-build.sh.\nmodule slipstream.local/%s\n\n' "$name"
      # The module's own language version, so its go directive is honoured.
      grep -E '^go ' "$mod" || true
      printf '\nrequire %s %s\n' "$module" "$version"
      # Replacements of the module itself are part of its build.
      awk '/^replace[[:space:]]*\(/{b=1;print;next} b&&/^\)/{b=0;print;next} b||/^replace /{print}' "$mod"
    } >"$src/go.mod.new"
    mv "$src/go.mod.new" "$src/go.mod"
  fi
  build_into "$name" "$pkg" "$src" "$ldflags"
}

for p in $missing; do
  case $p in
    coredns) build_module coredns github.com/coredns/coredns "$COREDNS_VERSION" github.com/coredns/coredns ;;
    helm)
      build_module helm helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
        "-s -w -buildid= -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
      ;;
    helm4)
      build_module helm4 helm.sh/helm/v4 "$HELM4_VERSION" helm.sh/helm/v4/cmd/helm \
        "-s -w -buildid= -X helm.sh/helm/v4/internal/version.version=$HELM4_VERSION"
      ;;
    crane) build_module crane github.com/google/go-containerregistry "$CRANE_VERSION" github.com/google/go-containerregistry/cmd/crane ;;
  esac
done

link_all
echo "$BIN_DIR"
