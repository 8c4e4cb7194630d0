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

# Release profile everywhere: the integration tests measure a real data path,
# and one profile means one compile of the dependencies.
cargo test --release --locked --workspace --no-fail-fast

# Nothing may be left behind by any test.
left=$(ip netns list | grep -E '^t-' || true)
if [ -n "$left" ]; then
  echo "test.sh: tests left network namespaces behind:" >&2
  echo "$left" >&2
  exit 1
fi
