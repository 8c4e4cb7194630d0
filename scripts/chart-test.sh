#!/usr/bin/env bash
# Tests the Helm charts deploy/helm/slipstream-crds and deploy/helm/slipstream
# without a cluster (seconds; no root):
#
#   scripts/chart-test.sh            check
#   scripts/chart-test.sh --update   rewrite the checked-in files it compares
#                                    with (review `git diff deploy/kubernetes`)
#
# 1. `helm lint --strict` (Helm 3 and Helm 4) of both charts, with their
#    default values and with ci/non-default-values.yaml (every value changed).
# 2. The values schema refuses bad values: `helm template` must fail.
# 3. The files for `kubectl apply` users, deploy/kubernetes/slipstream-crds.yaml
#    and slipstream.yaml, are the charts rendered with default values
#    (namespace slipstream-system, without hooks), and Helm 4 renders what
#    Helm 3 does.
# 4. Every RBAC rule the chart can grant (ClusterRoles and Roles, hooks
#    included, with default and non-default values) is listed in
#    deploy/kubernetes/rbac-rules.txt, and nothing else is: a rule added or
#    removed fails here until the list says so. The chart's ClusterRole
#    slipstream-control grants what deploy/kubernetes/control-plane-rbac.yaml
#    (the one crates/control/tests/kubernetes.rs runs with) does.
# 5. The pods: no hostPort, no `latest` (or missing) image tag, resources on
#    every container, DaemonSet slipstream-node at system-node-critical
#    tolerating every taint.
#
# Helm comes from scripts/kube-build.sh (built once into its cache); the
# YAML checks use python3 with PyYAML.
set -euo pipefail
cd "$(dirname "$0")/.."

UPDATE=0
case "${1:-}" in
  "") ;;
  --update) UPDATE=1 ;;
  *)
    echo "usage: scripts/chart-test.sh [--update]" >&2
    exit 2
    ;;
esac

CRDS_CHART=deploy/helm/slipstream-crds
MAIN_CHART=deploy/helm/slipstream
NAMESPACE=slipstream-system
GOLDEN_DIR=deploy/kubernetes
RULES_FILE=$GOLDEN_DIR/rbac-rules.txt

say() { echo "chart-test.sh: $*"; }
fail() {
  echo "chart-test.sh: FAIL: $*" >&2
  exit 1
}

if ! python3 -c 'import yaml' 2>/dev/null; then
  fail "python3 with PyYAML is needed for the YAML checks (Debian: apt-get install python3-yaml)"
fi

# kubectl too, for the API server check (built from the Go cache that
# kube-apiserver's build filled: seconds).
BIN=$(./scripts/kube-build.sh helm helm4 kubectl | tail -n1)
HELM3=$BIN/helm
HELM4=$BIN/helm4
for h in "$HELM3" "$HELM4"; do
  [ -x "$h" ] || fail "$h is missing (scripts/kube-build.sh helm helm4 should have built it)"
done
say "helm: $("$HELM3" version --short), $("$HELM4" version --short)"

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

# Starts etcd and kube-apiserver (no controllers: nothing runs) and applies
# the files as the docs tell kubectl users to, the CRDs with Istio's kinds,
# the hooks and the non-default render (server-side dry run), and one object
# of each minimal CRD, read back with its spec intact.
api_server_check() {
  local apiserver=$BIN/kube-apiserver etcd
  etcd=$(command -v etcd || true)
  if [ -z "$etcd" ] || [ ! -x "$apiserver" ] || [ ! -x "$BIN/kubectl" ]; then
    if [ -n "${CI:-}" ]; then
      fail "the API server check cannot run (needs etcd on PATH and $apiserver and $BIN/kubectl: scripts/kube-build.sh kube-apiserver kubectl), and CI must not skip it"
    fi
    say "SKIPPED: the API server check (needs etcd on PATH and $apiserver and $BIN/kubectl: scripts/kube-build.sh kube-apiserver kubectl)"
    return 0
  fi
  local ports etcd_port peer_port api_port
  ports=$(python3 -c 'import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
  read -r etcd_port peer_port api_port <<<"$ports"
  mkdir -p "$WORK/api"
  "$etcd" --name chart-test --data-dir "$WORK/api/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "chart-test=http://127.0.0.1:$peer_port" >"$WORK/api/etcd.log" 2>&1 &
  PIDS+=($!)
  openssl genrsa -out "$WORK/api/sa.key" 2048 2>/dev/null
  echo "chart-test-token,admin,admin,system:masters" >"$WORK/api/tokens.csv"
  "$apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" --bind-address 127.0.0.1 \
    --secure-port "$api_port" --advertise-address 127.0.0.1 --cert-dir "$WORK/api/certs" \
    --token-auth-file "$WORK/api/tokens.csv" --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$WORK/api/sa.key" --service-account-signing-key-file "$WORK/api/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 --allow-privileged=true --endpoint-reconciler-type none \
    >"$WORK/api/apiserver.log" 2>&1 &
  PIDS+=($!)
  kc() { "$BIN/kubectl" --server "https://127.0.0.1:$api_port" --insecure-skip-tls-verify --token chart-test-token "$@"; }
  local i
  for i in $(seq 1 120); do
    kc get --raw /readyz >/dev/null 2>&1 && break
    [ "$i" = 120 ] && { tail -n 20 "$WORK/api/apiserver.log" >&2; fail "kube-apiserver did not become ready in 60 s (its log's end above)"; }
    sleep 0.5
  done
  say "API server check: etcd and kube-apiserver $("$apiserver" --version | cut -d' ' -f2) up on 127.0.0.1:$api_port"
  step() { # description, command...
    local what=$1
    shift
    if ! "$@" >"$WORK/api/step.out" 2>&1; then
      cat "$WORK/api/step.out" >&2
      fail "API server check: $what (output above)"
    fi
    say "ok: API server: $what"
  }
  step "applied deploy/kubernetes/slipstream-crds.yaml (kubectl apply --server-side)" kc apply --server-side -f "$GOLDEN_DIR/slipstream-crds.yaml"
  render "$HELM3" "$CRDS_CHART" slipstream-crds --set istio.enabled=true >"$WORK/api/crds-istio.yaml"
  step "applied the CRDs chart with istio.enabled=true" kc apply --server-side -f "$WORK/api/crds-istio.yaml"
  step "every CRD Established" kc wait --for condition=Established --timeout 60s crd --all
  step "applied deploy/kubernetes/slipstream.yaml (kubectl apply)" kc apply -f "$GOLDEN_DIR/slipstream.yaml"
  kc create namespace istio-system >/dev/null
  step "accepts the chart with hooks and default values (server-side dry run)" kc apply --server-side --force-conflicts --dry-run=server -f "$WORK/all-default.yaml"
  step "accepts the chart with non-default values (server-side dry run)" kc apply --server-side --force-conflicts --dry-run=server -f "$WORK/all-non-default.yaml"
  cat >"$WORK/api/objects.yaml" <<'OBJECTS'
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: chart-test, namespace: default}
spec: {endpointSelector: {matchLabels: {app: a}}, ingress: [{fromEndpoints: [{matchLabels: {app: b}}]}]}
---
apiVersion: slipstream.io/v1alpha1
kind: LocalRateLimitPolicy
metadata: {name: chart-test, namespace: default}
spec: {targetRefs: [{kind: Service, name: a}], limit: {requests: 10, interval: 1s}}
---
apiVersion: security.istio.io/v1beta1
kind: AuthorizationPolicy
metadata: {name: chart-test, namespace: default}
spec: {action: DENY, rules: [{from: [{source: {namespaces: [other]}}]}]}
---
apiVersion: networking.istio.io/v1alpha3
kind: VirtualService
metadata: {name: chart-test, namespace: default}
spec: {hosts: [a], http: [{route: [{destination: {host: a}}]}]}
OBJECTS
  step "applied one object of each minimal CRD" kc apply -f "$WORK/api/objects.yaml"
  local got
  got=$(kc -n default get authorizationpolicies.v1.security.istio.io chart-test -o jsonpath='{.spec.rules[0].from[0].source.namespaces[0]}')
  [ "$got" = other ] || fail "API server check: an AuthorizationPolicy's spec did not survive (read back as v1: '$got')"
  got=$(kc -n default get localratelimitpolicies chart-test -o jsonpath='{.spec.limit.interval}')
  [ "$got" = 1s ] || fail "API server check: a LocalRateLimitPolicy's spec did not survive (read back: '$got')"
  say "ok: their specs read back whole (an AuthorizationPolicy written as v1beta1 read as v1)"
}

# ---------------------------------------------------------------------------
# 1. Lint.
for h in "$HELM3" "$HELM4"; do
  for chart in "$CRDS_CHART" "$MAIN_CHART"; do
    for values in "" "$chart/ci/non-default-values.yaml"; do
      args=(lint --strict "$chart")
      what="default values"
      if [ -n "$values" ]; then
        args+=(-f "$values")
        what=$values
      fi
      if ! "$h" "${args[@]}" >"$WORK/lint.out" 2>&1; then
        cat "$WORK/lint.out" >&2
        fail "$(basename "$h") lint of $chart with $what (output above)"
      fi
      say "ok: $(basename "$h") lint --strict $chart ($what)"
    done
  done
done

# ---------------------------------------------------------------------------
# 2. The schema refuses bad values. Each line: chart, then the --set.
refused=0
while read -r chart set; do
  for h in "$HELM3" "$HELM4"; do
    if "$h" template x "$chart" -n "$NAMESPACE" --set "$set" >"$WORK/refuse.out" 2>&1; then
      fail "$(basename "$h") template $chart --set $set succeeded; the values schema should refuse it"
    fi
    if ! grep -q "values don't meet the specifications of the schema" "$WORK/refuse.out"; then
      cat "$WORK/refuse.out" >&2
      fail "$(basename "$h") template $chart --set $set failed, but not by the values schema (output above)"
    fi
  done
  refused=$((refused + 1))
  say "ok: schema refuses --set $set ($(basename "$chart"): $(grep -m1 "^- at" "$WORK/refuse.out" || true))"
done <<EOF
$MAIN_CHART datapath.mode=bogus
$MAIN_CHART datapath.mode=auto
$MAIN_CHART datapath.bpfDir=/tmp/bpf
$MAIN_CHART datapath.bpfDir=/sys/fs/bpf/a/..
$MAIN_CHART datapath.bpfDir=/sys/fs/bpf/node.example.com
$MAIN_CHART datapath.cgroup=kh
$MAIN_CHART datapath.cgroup=/a/../b
$MAIN_CHART datapath.serviceBalancing=true
$MAIN_CHART control.replicas=-1
$MAIN_CHART control.replicas=0
$MAIN_CHART control.leaderElection=maybe
$MAIN_CHART image.tag=latest
$MAIN_CHART image.pullPolicy=Sometimes
$MAIN_CHART unknownKey=1
$MAIN_CHART control.unknownKey=1
$MAIN_CHART node.resources.proxy.requests.gpu=1
$MAIN_CHART cni.binDir=relative/path
$MAIN_CHART ca.existingSecret=Not_A_Name
$CRDS_CHART istio.enabled=maybe
$CRDS_CHART unknownKey=1
EOF

# ---------------------------------------------------------------------------
# 3. Render; golden files for kubectl users.
render() { # helm, chart, release, extra args...
  local h=$1 chart=$2 release=$3
  shift 3
  "$h" template "$release" "$chart" -n "$NAMESPACE" "$@"
}
for h in "$HELM3" "$HELM4"; do
  n=$(basename "$h")
  render "$h" "$CRDS_CHART" slipstream-crds >"$WORK/$n-crds.yaml"
  render "$h" "$MAIN_CHART" slipstream --no-hooks >"$WORK/$n-main.yaml"
done
for f in crds main; do
  # Helm 4 leaves a blank line at the end of some documents: not a difference.
  if ! diff -u <(grep -v '^$' "$WORK/helm-$f.yaml") <(grep -v '^$' "$WORK/helm4-$f.yaml") >"$WORK/h34.diff"; then
    head -n 40 "$WORK/h34.diff" >&2
    fail "Helm 4 renders the $f chart differently from Helm 3 (diff above, first 40 lines)"
  fi
done
say "ok: Helm 3 and Helm 4 render both charts alike (blank lines aside)"

{
  cat <<'EOF'
# Slipstream's custom resource definitions for `kubectl apply` users: the
# chart deploy/helm/slipstream-crds rendered with its default values
# (Gateway API v1.4.1 standard channel, CiliumNetworkPolicy,
# LocalRateLimitPolicy; not Istio's kinds). Made by
# `scripts/chart-test.sh --update`: edit the chart, never this file.
#
#   kubectl apply --server-side -f deploy/kubernetes/slipstream-crds.yaml
#
# (--server-side: some definitions are larger than the annotation a
# client-side apply keeps.) Deleting a definition deletes every object of
# its kind: this file is not meant for `kubectl delete -f`.
EOF
  cat "$WORK/helm-crds.yaml"
} >"$WORK/slipstream-crds.yaml"
{
  cat <<EOF
# Slipstream for \`kubectl apply\` users: the chart deploy/helm/slipstream
# rendered with its default values in namespace $NAMESPACE (after
# that Namespace), without Helm's hooks. Made by
# \`scripts/chart-test.sh --update\`: edit the chart, never this file.
#
#   kubectl apply --server-side -f deploy/kubernetes/slipstream-crds.yaml
#   kubectl apply -f deploy/kubernetes/slipstream.yaml
#
# Uninstall: first mark the DaemonSet (what the chart's pre-delete hook
# does for Helm users), so that each node agent, as it stops, releases its
# node's pods and removes the CNI plugin; without the mark a stopping agent
# leaves its node meshed (as for an upgrade) and new pods there wait:
#
#   kubectl -n $NAMESPACE annotate daemonset slipstream-node slipstream.io/uninstall=true
#   kubectl delete -f deploy/kubernetes/slipstream.yaml
#
# (which deletes the namespace, and the CA's Secret slipstream-ca with it).
# The CRDs stay: deleting one deletes every object of its kind.
---
# The agent and the node proxy need host namespaces, hostPath volumes and
# capabilities: Pod Security "privileged" for this namespace only.
apiVersion: v1
kind: Namespace
metadata:
  name: $NAMESPACE
  labels:
    pod-security.kubernetes.io/enforce: privileged
EOF
  cat "$WORK/helm-main.yaml"
} >"$WORK/slipstream.yaml"

for f in slipstream-crds.yaml slipstream.yaml; do
  if [ "$UPDATE" = 1 ]; then
    cp "$WORK/$f" "$GOLDEN_DIR/$f"
    say "updated $GOLDEN_DIR/$f"
  elif ! diff -u "$GOLDEN_DIR/$f" "$WORK/$f" >"$WORK/golden.diff"; then
    head -n 80 "$WORK/golden.diff" >&2
    fail "$GOLDEN_DIR/$f is not what the chart renders (diff above: - the file, + the chart; first 80 lines). If the chart change is intended: scripts/chart-test.sh --update, and review git diff"
  else
    say "ok: $GOLDEN_DIR/$f is the chart rendered with default values"
  fi
done

# Everything the main chart can render, hooks included, for the checks below.
render "$HELM3" "$MAIN_CHART" slipstream >"$WORK/all-default.yaml"
render "$HELM3" "$MAIN_CHART" slipstream -f "$MAIN_CHART/ci/non-default-values.yaml" >"$WORK/all-non-default.yaml"

# ---------------------------------------------------------------------------
# 4 and 5: RBAC rules and pod checks, over the parsed YAML.
python3 - "$WORK/all-default.yaml" "$WORK/all-non-default.yaml" "$GOLDEN_DIR/control-plane-rbac.yaml" "$WORK/rules.txt" <<'PY'
import sys
import yaml

default_path, non_default_path, reference_path, rules_out = sys.argv[1:5]
problems = []


def docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def say(msg):
    print(f"chart-test.sh: {msg}")


def rule_lines(objects, only=None):
    """One line per (apiGroup, resource, verb) of every ClusterRole and Role."""
    lines = set()
    for o in objects:
        kind, name = o.get("kind"), o["metadata"]["name"]
        if kind not in ("ClusterRole", "Role") or (only and (kind, name) != only):
            continue
        for r in o.get("rules") or []:
            if r.get("nonResourceURLs") or r.get("resourceNames"):
                problems.append(f"{kind}/{name}: a rule with nonResourceURLs or resourceNames, which rbac-rules.txt cannot say: extend the check")
            for g in r.get("apiGroups", []):
                for res in r.get("resources", []):
                    for v in r.get("verbs", []):
                        if "*" in (g, res, v):
                            problems.append(f"{kind}/{name}: wildcard in {g or 'core'} {res} {v}: name each group, resource and verb")
                        lines.add(f"{kind}/{name} {g or 'core'} {res} {v}")
    return lines


renders = {"default values": docs(default_path), "non-default values": docs(non_default_path)}

# 4. RBAC: every rule any of the two renders grants.
rules = set()
for objects in renders.values():
    rules |= rule_lines(objects)
with open(rules_out, "w") as f:
    f.write("".join(line + "\n" for line in sorted(rules)))

# The chart's ClusterRole slipstream-control against the reference file.
reference = rule_lines(docs(reference_path), ("ClusterRole", "slipstream-control"))
chart = rule_lines(renders["default values"], ("ClusterRole", "slipstream-control"))
if reference != chart:
    for line in sorted(chart - reference):
        problems.append(f"ClusterRole slipstream-control grants, control-plane-rbac.yaml does not: {line}")
    for line in sorted(reference - chart):
        problems.append(f"control-plane-rbac.yaml grants, the chart's ClusterRole slipstream-control does not: {line}")
else:
    say(f"ok: ClusterRole slipstream-control grants what deploy/kubernetes/control-plane-rbac.yaml does ({len(chart)} rules)")

# 5. Pods.
checked = 0
for label, objects in renders.items():
    for o in objects:
        kind, name = o.get("kind"), o["metadata"]["name"]
        spec = o.get("spec", {})
        pod = spec.get("template", {}).get("spec") if kind in ("Deployment", "DaemonSet", "Job", "StatefulSet") else None
        if pod is None:
            continue
        where = f"{kind}/{name} ({label})"
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            checked += 1
            cw = f"{where} container {c['name']}"
            for p in c.get("ports", []):
                if "hostPort" in p:
                    problems.append(f"{cw}: hostPort {p['hostPort']} (no hostPort anywhere: it blocks a surging rolling update)")
            if pod.get("hostNetwork") and c.get("ports"):
                problems.append(f"{cw}: declares ports on a hostNetwork pod (the API server makes each a hostPort)")
            image = c.get("image", "")
            last = image.rsplit("/", 1)[-1]
            if ":" not in last or last.endswith(":latest"):
                problems.append(f"{cw}: image {image!r} has no tag or the tag latest")
            res = c.get("resources") or {}
            if not (res.get("requests") and res.get("limits", {}).get("memory")):
                problems.append(f"{cw}: resources must have requests and a memory limit, has {res}")
        if kind == "DaemonSet":
            if pod.get("priorityClassName") != "system-node-critical":
                problems.append(f"{where}: priorityClassName is {pod.get('priorityClassName')!r}, not system-node-critical")
            if not any(t.get("operator") == "Exists" and not t.get("key") and not t.get("effect") for t in pod.get("tolerations", [])):
                problems.append(f"{where}: no toleration {{operator: Exists}} (every taint)")
if problems:
    for p in problems:
        print(f"chart-test.sh: FAIL: {p}", file=sys.stderr)
    sys.exit(1)
say(f"ok: {checked} containers (both renders, hooks included): no hostPort, no latest tag, resources on each; DaemonSet slipstream-node system-node-critical, tolerating every taint")
PY

if [ "$UPDATE" = 1 ]; then
  {
    echo "# Every RBAC rule the chart deploy/helm/slipstream can grant (ClusterRoles and"
    echo "# Roles, the uninstall hook's included, with default and non-default values):"
    echo "# <kind>/<name> <apiGroup> <resource> <verb>, core group as \`core\`. Made by"
    echo "# \`scripts/chart-test.sh --update\`; a change here is a change of what"
    echo "# Slipstream may do in a cluster: review it."
    cat "$WORK/rules.txt"
  } >"$RULES_FILE"
  say "updated $RULES_FILE ($(wc -l <"$WORK/rules.txt") rules)"
else
  [ -f "$RULES_FILE" ] || fail "$RULES_FILE is missing: scripts/chart-test.sh --update writes it"
  if ! diff -u <(grep -v '^#' "$RULES_FILE") "$WORK/rules.txt" >"$WORK/rules.diff"; then
    echo "chart-test.sh: RBAC rules, - listed in $RULES_FILE only, + granted by the chart only:" >&2
    grep '^[-+][^-+]' "$WORK/rules.diff" >&2 || true
    fail "the chart's RBAC rules are not those of $RULES_FILE (above). A rule added or removed on purpose: scripts/chart-test.sh --update, and review git diff"
  fi
  say "ok: the chart grants exactly the $(wc -l <"$WORK/rules.txt") rules of $RULES_FILE"
fi

# ---------------------------------------------------------------------------
# 6. A real API server takes every object (when etcd and the harness's
#    kube-apiserver are already on this machine; never built here).
api_server_check
if [ "$UPDATE" = 1 ]; then
  say "updated; review: git diff $GOLDEN_DIR"
else
  say "all checks passed ($refused bad values refused)"
fi
