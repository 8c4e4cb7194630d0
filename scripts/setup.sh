#!/usr/bin/env bash
# Installs what Slipstream needs on a Debian/Ubuntu machine. Idempotent: a
# second run installs nothing and takes a second. Run as root.
#
# What each package is for:
#   iproute2        ip netns / veth / routes for the local cluster
#   nftables        service VIPs (kernel DNAT) and, in l4-nft mode, capture
#   curl python3    the tour and the integration tests use them from inside pods
#   python3-yaml    scripts/chart-test.sh reads the charts' rendered objects
#   iperf3          benchmark T1/T2 and throughput tests
#   tcpdump         tests that prove only TLS crosses the node network
#   procps psmisc   ps/pkill for debugging
#   clang llvm libbpf-dev bpftool   the eBPF datapath (built by build.rs)
#   etcd-server     the store of the real kube-apiserver the control plane's
#                   Kubernetes tests run (crates/kubetest; kube-apiserver
#                   itself is built by scripts/kube-apiserver.sh)
#   containerd runc containernetworking-plugins conntrack docker-registry
#                   the Kubernetes test harness (scripts/kube-cluster.sh,
#                   docs/kube-harness.md): each node's container runtime,
#                   its pod network (bridge, host-local, loopback), what
#                   kube-proxy needs, and the registry its images come from
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  echo "setup.sh: must run as root (it installs packages with apt-get)" >&2
  exit 1
fi

PKGS=(iproute2 nftables curl iperf3 tcpdump procps psmisc python3 python3-yaml clang llvm libbpf-dev bpftool etcd-server
  containerd runc containernetworking-plugins conntrack docker-registry)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # etcd-server, containerd and docker-registry would start machine-wide
  # services; the tests and the harness run their own, so none is started
  # (Debian's policy-rc.d convention, for the install only).
  policy=/usr/sbin/policy-rc.d
  made_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ -n "$made_policy" ] && rm -f "$policy"
  if [ -d /run/systemd/system ]; then
    for svc in etcd containerd docker-registry; do
      systemctl disable --now "$svc" >/dev/null 2>&1 || true
    done
  fi
else
  echo "setup.sh: system packages present"
fi

# bpffs: the node proxy pins its maps here.
if ! grep -q " /sys/fs/bpf bpf " /proc/mounts; then
  mkdir -p /sys/fs/bpf
  mount -t bpf bpf /sys/fs/bpf
  echo "setup.sh: mounted bpffs at /sys/fs/bpf"
fi

# fortio (benchmarks and load tests). BENCHMARKS.md pins v1.63.0: newer
# versions pull a module the package proxy refuses.
if ! command -v fortio >/dev/null 2>&1 && [ ! -x "${GOPATH:-$HOME/go}/bin/fortio" ]; then
  if command -v go >/dev/null 2>&1; then
    echo "setup.sh: installing fortio v1.63.0 with go install"
    GOFLAGS=-mod=mod go install fortio.org/fortio@v1.63.0
  else
    echo "setup.sh: WARNING: go not found; fortio not installed (needed only by benchmarks)" >&2
  fi
fi
# A copy, not a link: pods run as non-root users, who cannot reach into
# root's home directory where `go install` puts it.
if [ -x "${GOPATH:-$HOME/go}/bin/fortio" ] && { [ ! -e /usr/local/bin/fortio ] || [ -L /usr/local/bin/fortio ]; }; then
  rm -f /usr/local/bin/fortio
  install -m 0755 "${GOPATH:-$HOME/go}/bin/fortio" /usr/local/bin/fortio
fi

# Rust toolchain is expected (rustup); say so clearly if missing.
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup.sh: cargo not found: install Rust (https://rustup.rs) and rerun" >&2
  exit 1
fi
echo "setup.sh: ready"
