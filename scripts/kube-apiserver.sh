#!/usr/bin/env bash
# The kube-apiserver that the control plane's Kubernetes tests run against
# (crates/kubetest): built by scripts/kube-build.sh (which says how and
# why) if missing, its path printed on the last line of stdout.
# SLIPSTREAM_KUBE_VERSION overrides the version, as there.
set -euo pipefail
dir=$("$(dirname "$0")/kube-build.sh" kube-apiserver | tail -n 1)
echo "$dir/kube-apiserver-${SLIPSTREAM_KUBE_VERSION:-v1.32.13}"
