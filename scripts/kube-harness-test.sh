#!/usr/bin/env bash
# The Kubernetes harness tier of `make test` (docs/kube-harness.md): brings
# the harness cluster up from nothing, builds and pushes the images, checks
# the slipstream image's files and that its layers build the same twice,
# runs bookinfo (examples/istio-samples/bookinfo.yaml, no mesh yet) with
# kubectl, checks that productpage renders from a pod on the other worker
# through its Service's name, installs Slipstream and proves it there
# (scripts/kube-mesh-test.sh), then takes everything down and checks that
# nothing is left and the machine's kernel settings never changed. Prints
# the time of each part. Needs root.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

fail() {
  echo "kube-harness-test: FAILED: $*" >&2
  echo "kube-harness-test: the harness's logs are in /var/lib/slipstream-kube/logs (kept; scripts/kube-cluster.sh down removes them)" >&2
  exit 1
}
t0=$(date +%s)
lap() {
  local now
  now=$(date +%s)
  echo "kube-harness-test: $1 in $((now - t0))s" >&2
  t0=$now
}

SYSCTLS="kernel/panic kernel/panic_on_oops vm/overcommit_memory vm/panic_on_oom kernel/keys/root_maxkeys kernel/keys/root_maxbytes"
sysctls() { for s in $SYSCTLS; do printf '%s=%s ' "$s" "$(cat "/proc/sys/$s")"; done; }
before=$(sysctls)

./scripts/kube-cluster.sh down >/dev/null 2>&1 || true
./scripts/kube-build.sh >/dev/null
lap "programs built (or found built)"
./scripts/kube-cluster.sh up >/dev/null 2>&1 || { ./scripts/kube-cluster.sh up || true; fail "kube-cluster.sh up"; }
lap "cluster up"
eval "$(./scripts/kube-cluster.sh env)"

tag=$(./scripts/kube-images.sh 2>/tmp/kube-images.log | tail -n 1) || { cat /tmp/kube-images.log >&2; fail "kube-images.sh"; }
lap "images built and pushed ($tag)"

# The slipstream image holds exactly the files listed in the repository.
crane="$(./scripts/kube-build.sh crane | tail -n 1)/crane"
got=$("$crane" export --insecure "$SLIPSTREAM_KH_REGISTRY/slipstream-mesh/slipstream:$tag" - | tar -t | sort)
if [ "$got" != "$(cat images/slipstream.files)" ]; then
  diff <(echo "$got") images/slipstream.files >&2 || true
  fail "the slipstream image's files differ from images/slipstream.files (above: < image, > list)"
fi
# Its layers build to the same bytes a second time.
second=$(mktemp -d)
SLIPSTREAM_KH_IMAGES=$second ./scripts/kube-images.sh --layers >/dev/null 2>&1
for l in slipstream pause curl fortio; do
  a=$(sha256sum "/var/tmp/slipstream-kube/images/$l.tar" | cut -d' ' -f1)
  b=$(sha256sum "$second/$l.tar" | cut -d' ' -f1)
  [ "$a" = "$b" ] || fail "layer $l.tar differs between two builds ($a, $b)"
done
rm -rf "$second"
lap "image files and reproducible layers checked"

# Three Ready nodes.
ready=$(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}')
[ "$ready" = "control-plane=True worker-1=True worker-2=True " ] || fail "nodes not Ready: $ready"

# bookinfo, as a user applies it, without any mesh.
kubectl create namespace bookinfo >/dev/null
kubectl apply -n bookinfo -f examples/istio-samples/bookinfo.yaml >/dev/null
kubectl wait -n bookinfo --for=condition=Available deployment --all --timeout=180s >/dev/null ||
  { kubectl get pods -n bookinfo -o wide >&2; fail "bookinfo's deployments did not become available"; }
nodes=$(kubectl get pods -n bookinfo -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort -u | tr '\n' ' ')
[ "$nodes" = "worker-1 worker-2 " ] || fail "bookinfo's pods are not on both workers: $nodes"
pp=$(kubectl get pod -n bookinfo -l app=productpage -o jsonpath='{.items[0].spec.nodeName}')
other=$([ "$pp" = worker-1 ] && echo worker-2 || echo worker-1)
kubectl run curl -n bookinfo --image="curlimages/curl:$(dpkg-query -W -f='${Version}' curl | sed 's/[-+~].*//')" \
  --restart=Never --overrides="{\"spec\":{\"nodeSelector\":{\"kubernetes.io/hostname\":\"$other\"}}}" \
  --command -- /bin/sleep infinity >/dev/null
kubectl wait -n bookinfo --for=condition=Ready pod/curl --timeout=60s >/dev/null || fail "the curl pod did not start on $other"
page=$(kubectl exec -n bookinfo curl -- curl -sS --max-time 10 http://productpage:9080/productpage) ||
  fail "productpage did not answer a pod on $other"
for want in "<title>Simple Bookstore App</title>" "Book Details" "Book Reviews"; do
  grep -qF "$want" <<<"$page" || fail "productpage (on $pp, called from $other) lacks '$want'"
done
lap "bookinfo served across nodes (productpage on $pp, client on $other)"

# A pod reaches neither the machine nor the registry (which would let it
# replace every node's images), and it is the guard that stops it (its
# counter moved: without it the machine answered by its default route).
dropped() { { nft list table inet slipstream_kube_harness 2>/dev/null || true; } | sed -n 's/.*ip saddr 10.78.0.0\/16 counter packets \([0-9]*\).*/\1/p'; }
was=$(dropped)
if kubectl exec -n bookinfo curl -- curl -sS --max-time 3 -o /dev/null "http://$SLIPSTREAM_KH_REGISTRY/v2/" 2>/dev/null; then
  fail "a pod reached the image registry at $SLIPSTREAM_KH_REGISTRY"
fi
[ "$(dropped)" -gt "${was:-0}" ] 2>/dev/null || fail "the machine's guard did not see the pod's packets (nft list table inet slipstream_kube_harness)"

# Slipstream on this cluster (issue 39): installed with Helm, the scenarios
# of the local cluster, upgrade, rollback, uninstall (scripts/kube-mesh-test.sh),
# once with each datapath (KUBE_DATAPATHS narrows it: "ebpf").
for dp in ${KUBE_DATAPATHS:-ebpf nftables}; do
  DATAPATH=$dp ./scripts/kube-mesh-test.sh "$tag" || fail "Slipstream on the harness cluster, datapath $dp (scripts/kube-mesh-test.sh)"
  lap "Slipstream installed, proven and uninstalled on the cluster (datapath $dp)"
done

./scripts/kube-cluster.sh down >/dev/null
left=""
compgen -G '/run/netns/kh-*' >/dev/null && left="$left network namespaces;"
compgen -G '/sys/fs/bpf/slipstream/kh-*' >/dev/null && left="$left eBPF pins;"
compgen -G '/run/netns/cni-*' >/dev/null && left="$left pods' network namespace files;"
ip link show khbr0 >/dev/null 2>&1 && left="$left the bridge;"
nft list table inet slipstream_kube_harness >/dev/null 2>&1 && left="$left nftables rules;"
ip -o link show 2>/dev/null | grep -q ' kh-' && left="$left veths;"
grep -q slipstream-kube /proc/mounts && left="$left mounts;"
for m in $(awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/mounts); do
  compgen -G "$m/kh-*" >/dev/null && left="$left cgroups in $m;"
done
pgrep -f '/var/(lib|tmp)/slipstream-kube' >/dev/null && left="$left processes;"
[ -e /var/lib/slipstream-kube ] || [ -e /run/slipstream-kube ] && left="$left state directories;"
[ -z "$left" ] || fail "down left:$left"
[ "$(sysctls)" = "$before" ] || fail "the machine's kernel settings changed: before $before, after $(sysctls)"
lap "down, nothing left, kernel settings unchanged"
echo "kube-harness-test: ok"
