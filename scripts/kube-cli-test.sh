#!/usr/bin/env bash
# The CLI against the Kubernetes install (issue 39, item 7): each command
# that can act on Kubernetes, run on the harness cluster with --kubeconfig
# (and KUBECONFIG alone, and under the names istioctl and hubble), its
# `-o json` parsed and checked for the local schema's keys
# (docs/status-json.md) and for meaningful content.
#
# Assumes the harness is up (scripts/kube-cluster.sh up), the chart
# installed and bookinfo meshed in namespace `bookinfo` with a curl pod
# there (`curl`, as scripts/kube-harness-test.sh makes it; CLIENT= names
# another). Makes namespace kube-cli-test (deleted at the end).
# No root needed beyond reading the harness's kubeconfig.
#
#   scripts/kube-cli-test.sh
#
# SLIPSTREAM names the binary (default: the release build, built if absent).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${KUBECONFIG:-}" || -z "$(command -v kubectl || true)" ]]; then
    eval "$(scripts/kube-cluster.sh env)"
fi
SLIPSTREAM=${SLIPSTREAM:-/var/tmp/slipstream-target/release/slipstream}
if [[ ! -x "$SLIPSTREAM" ]]; then
    cargo build --release --locked -p slipstream-cli
fi
KC=$KUBECONFIG
NS=kube-cli-test
# A cluster name no local cluster has: KUBECONFIG alone then means Kubernetes.
export SLIPSTREAM_CLUSTER=kube-cli-test-none
WORK=$(mktemp -d)
cleanup() {
    kubectl delete namespace "$NS" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

pass=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
fail() { echo "FAIL $*" >&2; exit 1; }
ss() { "$SLIPSTREAM" "$@"; }
# check FILE PYTHON: the JSON in FILE as `j`; PYTHON asserts about it.
check() {
    python3 -c "import json,sys
j = json.load(open(sys.argv[1]))
$2" "$1" || fail "$3 (output in $1)"
}

# status: the local schema's keys, plus target; three nodes each with its
# node proxy; the control plane replicas; bookinfo's pods meshed.
ss status --kubeconfig "$KC" -o json >"$WORK/status.json"
check "$WORK/status.json" '
for k in ("version", "cluster", "agent", "control", "nodes", "pods", "services", "target"):
    assert k in j, k
assert j["version"] == 1 and j["agent"]["running"]
assert j["target"]["kind"] == "kubernetes" and j["target"]["server"].startswith("https://"), j["target"]
assert len(j["nodes"]) == 3 and all(n["proxy"] is not None for n in j["nodes"]), j["nodes"]
assert len(j["control"]) >= 1 and all(c["address"].endswith(":15012") for c in j["control"])
pp = [p for p in j["pods"] if p["namespace"] == "bookinfo" and p["name"].startswith("productpage-v1-")]
assert pp and pp[0]["meshed"] and pp[0]["owner"] == "Deployment/productpage-v1", pp
for k in ("namespace", "name", "node", "ip", "serviceAccount", "labels", "phase", "ready", "restarts", "containers"):
    assert k in pp[0], k
assert any(s["name"] == "reviews" and s["namespace"] == "bookinfo" and s["endpoints"] for s in j["services"])
' "status -o json"
ok "status -o json: 3 nodes with node proxies, $(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["control"]))' "$WORK/status.json") control plane replicas, bookinfo meshed"
ss status --kubeconfig "$KC" | head -1 | grep -q '^Kubernetes cluster .* at https://' || fail "status names its target"
ok "status names its target: $(ss status --kubeconfig "$KC" | head -1)"
# KUBECONFIG alone (no local cluster of the name) is Kubernetes too.
KUBECONFIG="$KC" ss status -o json >"$WORK/status-env.json"
check "$WORK/status-env.json" 'assert j["target"]["kubeconfig"].startswith("KUBECONFIG="), j["target"]' "status with KUBECONFIG"
ok "status with KUBECONFIG alone acts on Kubernetes"
NODES=$(python3 -c 'import json,sys; print(" ".join(n["name"] for n in json.load(open(sys.argv[1]))["nodes"]))' "$WORK/status.json")
PP_NODE=$(python3 -c 'import json,sys; print([p["node"] for p in json.load(open(sys.argv[1]))["pods"] if p["name"].startswith("productpage-v1-")][0])' "$WORK/status.json")

# proxy-status: every node's proxy connected to a replica, all SYNCED.
ss proxy-status --kubeconfig "$KC" -o json >"$WORK/proxy-status.json"
check "$WORK/proxy-status.json" "
nodes = set('$NODES'.split())
assert isinstance(j, list) and j, j
assert all('error' not in r for r in j), [r for r in j if 'error' in r]
seen = {}
for r in j:
    assert 'replica' in r and 'proxies' in r, r.keys()
    for p in r['proxies']:
        if p['id'].startswith('ztunnel~0.0.0.0~') or p['node'] in nodes and 'waypoint' not in p['id']:
            seen[p['node']] = p
assert set(seen) == nodes, (sorted(seen), sorted(nodes))
for n, p in seen.items():
    assert all(t['inSync'] for t in p['types']), (n, p['types'])
" "proxy-status -o json"
ok "proxy-status -o json: node proxies of $NODES all connected and in sync"
ss proxy-status --kubeconfig "$KC" >/dev/null

# proxy-config: the workloads and certificates of productpage's node
# proxy name productpage's identity.
ss proxy-config --kubeconfig "$KC" "$PP_NODE" workloads -o json >"$WORK/workloads.json"
check "$WORK/workloads.json" '
w = [w for w in j if w["namespace"] == "bookinfo" and w["name"].startswith("productpage-v1-")]
assert w and w[0]["service_account"] == "bookinfo-productpage", w
' "proxy-config workloads"
ss proxy-config --kubeconfig "$KC" "$PP_NODE" certs -o json >"$WORK/certs.json"
check "$WORK/certs.json" '
ids = [c["identity"] for c in j]
assert "spiffe://cluster.local/ns/bookinfo/sa/bookinfo-productpage" in ids, ids
' "proxy-config certs"
ok "proxy-config $PP_NODE: productpage as spiffe://cluster.local/ns/bookinfo/sa/bookinfo-productpage"
ss proxy-config --kubeconfig "$KC" "$PP_NODE" all -o json >"$WORK/all.json"
check "$WORK/all.json" 'assert {"workloads", "services", "policies", "certificates", "localPods"} <= set(j), list(j)' "proxy-config all"

# policy check: productpage may call reviews.
ss policy check --kubeconfig "$KC" --from bookinfo/deploy/productpage-v1 --to bookinfo/deploy/reviews-v1:9080 -o json >"$WORK/policy.json"
check "$WORK/policy.json" '
for k in ("verdict", "from", "to", "port", "allowed", "egress", "ingress"):
    assert k in j, k
assert j["verdict"] == "allow", j["verdict"]
' "policy check"
ok "policy check productpage -> reviews:9080: allow"

# observe: bookinfo's connections, from the node proxies' access logs.
kubectl -n bookinfo exec "${CLIENT:-curl}" -- curl -s -o /dev/null -w '%{http_code}\n' http://productpage:9080/productpage | grep -q 200 ||
    fail "productpage through the mesh"
found=
for _ in $(seq 1 20); do
    ss observe --kubeconfig "$KC" --to-namespace bookinfo --last 0 -o json >"$WORK/observe.json" 2>"$WORK/observe.err"
    if python3 -c "
import json, sys
flows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for f in flows:
    for k in ('seq', 'timeMs', 'node', 'source', 'destination', 'verdict', 'point'):
        assert k in f, (k, f)
assert any(f['verdict'] == 'REDIRECTED' and f['destination'].get('pod', '').startswith('bookinfo/productpage-v1-') for f in flows)
" "$WORK/observe.json"; then found=1; break; fi
    sleep 1
done
[[ -n $found ]] || fail "observe shows the connection to productpage (output in $WORK/observe.json)"
grep -q "node proxies' connections, from their access logs" "$WORK/observe.err" || fail "observe says where its flows come from on Kubernetes (the node proxies' access logs)"
ok "observe -o json: ${CLIENT:-curl} -> productpage REDIRECTED by the node proxies (and says where the flows come from)"

# The tools' names.
ln -s "$SLIPSTREAM" "$WORK/istioctl"
ln -s "$SLIPSTREAM" "$WORK/hubble"
"$WORK/istioctl" proxy-status --kubeconfig "$KC" -o json | python3 -c 'import json,sys; assert json.load(sys.stdin)'
"$WORK/istioctl" ztunnel-config workloads --kubeconfig "$KC" -o json | python3 -c 'import json,sys; assert json.load(sys.stdin)'
"$WORK/hubble" observe --kubeconfig "$KC" --last 3 -o json 2>/dev/null | python3 -c 'import json,sys; [json.loads(l) for l in sys.stdin]'
ok "istioctl proxy-status, istioctl ztunnel-config, hubble observe"

# x waypoint: apply, list, status, delete (the Gateway through the API).
kubectl create namespace "$NS" >/dev/null
ss x waypoint apply --kubeconfig "$KC" -n "$NS" --name cli-waypoint --timeout 120s
kubectl -n "$NS" get gateway cli-waypoint -o jsonpath='{.spec.gatewayClassName}' | grep -qx istio-waypoint || fail "the Gateway was made"
"$WORK/istioctl" waypoint list --kubeconfig "$KC" -n "$NS" | tee "$WORK/list.txt"
grep -Eq '^cli-waypoint +default +True' "$WORK/list.txt" || fail "waypoint list shows it programmed"
ss x waypoint status --kubeconfig "$KC" -n "$NS" --name cli-waypoint | grep -q Programmed || fail "waypoint status"
ss x waypoint delete --kubeconfig "$KC" -n "$NS" cli-waypoint
[[ -z "$(kubectl -n "$NS" get gateway -o name)" ]] || fail "waypoint delete"
ss x waypoint list --kubeconfig "$KC" -n "$NS" | grep -q 'No waypoints found' || fail "waypoint list after delete"
ok "x waypoint apply, list, status, delete"

echo "kube-cli-test: $pass checks passed"
