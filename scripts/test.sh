#!/usr/bin/env bash
# The whole test suite: unit tests of every crate, then the integration tests
# that build real clusters of network namespaces. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "test.sh: the integration tests need root (network namespaces, cgroups); run as root" >&2
  exit 1
fi
if ! grep -q " /sys/fs/bpf bpf " /proc/mounts; then
  mkdir -p /sys/fs/bpf && mount -t bpf bpf /sys/fs/bpf
fi

# Formatting and lints first: they take a minute, the tests take many.
for tool in fmt clippy; do
  if ! cargo "$tool" --version >/dev/null 2>&1; then
    component=$([ "$tool" = fmt ] && echo rustfmt || echo clippy)
    echo "test.sh: cargo $tool is missing; install it with: rustup component add $component" >&2
    exit 1
  fi
done
if ! cargo fmt --all --check; then
  echo "test.sh: the code is not formatted as rustfmt.toml says (diff above); run: cargo fmt --all" >&2
  exit 1
fi
# --release, as the tests below: they share build scripts and proc macros.
if ! cargo clippy --release --locked --workspace --all-targets -- -D warnings; then
  echo "test.sh: clippy refused the code (above). Fix each warning, or, if one is wrong for this" >&2
  echo "  code, allow it where it occurs with a comment saying why (or in [workspace.lints] of" >&2
  echo "  Cargo.toml, with a reason). Check again with:" >&2
  echo "    cargo clippy --release --locked --workspace --all-targets -- -D warnings" >&2
  exit 1
fi

# The real kube-apiserver of the Kubernetes tests (crates/kubetest):
# 10-15 minutes to build the first time, a second once it is cached.
if [ -z "${SLIPSTREAM_KUBE_APISERVER:-}" ]; then
  SLIPSTREAM_KUBE_APISERVER=$(./scripts/kube-apiserver.sh | tail -n 1)
fi
export SLIPSTREAM_KUBE_APISERVER
echo "test.sh: kube-apiserver $SLIPSTREAM_KUBE_APISERVER"

# The Helm charts without a cluster (docs/kubernetes.md): lint with Helm 3
# and 4, the values schema, the golden files of deploy/kubernetes, the
# RBAC rules, and a real API server taking every object.
./scripts/chart-test.sh

# Release profile everywhere: the integration tests measure a real data path,
# and one profile means one compile of the dependencies.
cargo test --release --locked --workspace --no-fail-fast

# The Kubernetes harness tier (docs/kube-harness.md): a real three-node
# Kubernetes from upstream parts, the images built here, bookinfo across
# its nodes, then everything taken down. Its programs take about 10 more
# minutes to build the first time (Go's caches keep them), the tier itself
# under a minute.
./scripts/kube-harness-test.sh

# Nothing may be left behind by any test.
left=$(ls /run/netns 2>/dev/null | grep -E '^t-' || true)
if [ -n "$left" ]; then
  echo "test.sh: tests left network namespaces behind:" >&2
  echo "$left" >&2
  exit 1
fi
