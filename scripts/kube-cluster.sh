#!/usr/bin/env bash
# A real multi-node Kubernetes on this one machine, from upstream parts:
# test infrastructure for installing Slipstream on Kubernetes, not part of
# the product. docs/kube-harness.md says what runs where and what it cannot
# prove (the nodes share one kernel).
#
#   scripts/kube-cluster.sh up       start it (builds what is missing first)
#   scripts/kube-cluster.sh env      print the exports for KUBECONFIG, kubectl, helm
#   scripts/kube-cluster.sh status   what runs, and the nodes as the API server sees them
#   scripts/kube-cluster.sh down     remove everything it made; safe to repeat, and after a crash
#
# Three nodes, each a network namespace and a mount namespace of its own
# with its own containerd, kubelet and kube-proxy and its own cgroup root:
# `control-plane` (also etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler and CoreDNS), `worker-1` and `worker-2`. They are joined by
# the bridge `khbr0` (10.77.0.0/24) in the machine's namespace, where the
# image registry listens (10.77.0.1:5000). Needs root.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${SLIPSTREAM_KH_STATE:-/var/lib/slipstream-kube}
RUN=${SLIPSTREAM_KH_RUN:-/run/slipstream-kube}
KUBE_CACHE=${SLIPSTREAM_KUBE_CACHE:-/var/tmp/slipstream-kube}

BRIDGE=khbr0
HOST_IP=10.77.0.1
NET_PREFIX=10.77.0
POD_PREFIX=10.78
SERVICE_CIDR=10.79.0.0/16
API_SERVICE_IP=10.79.0.1
CLUSTER_CIDR=$POD_PREFIX.0.0/16
REGISTRY=$HOST_IP:5000
CLUSTER_DOMAIN=cluster.local
PAUSE_IMAGE=registry.k8s.io/pause:3.10

# name, index (node IP .<index+2>, pod CIDR 10.78.<index>.0/24)
NODES="control-plane worker-1 worker-2"
node_index() {
  case $1 in control-plane) echo 0 ;; worker-1) echo 1 ;; worker-2) echo 2 ;; *) return 1 ;; esac
}
node_ip() { echo "$NET_PREFIX.$(($(node_index "$1") + 2))"; }
node_cidr() { echo "$POD_PREFIX.$(node_index "$1").0/24"; }
netns_of() { echo "kh-$1"; }
# The node's veth on the bridge (interface names are at most 15 bytes).
veth_of() {
  case $1 in control-plane) echo kh-cp ;; worker-*) echo "kh-w${1#worker-}" ;; esac
}
CP_IP=$(node_ip control-plane)

# The kernel settings a kubelet writes machine-wide when it is not told to
# leave them (protectKernelDefaults): in each node's mount namespace an
# ordinary file is bind-mounted over each, so the kubelet reads and writes
# its own copy and a kernel oops never reboots the machine.
SHIELDED_SYSCTLS="kernel/panic kernel/panic_on_oops vm/overcommit_memory vm/panic_on_oom kernel/keys/root_maxkeys kernel/keys/root_maxbytes"
# Paths a kubelet or containerd uses whatever their flags say: a directory
# of the node's own is bind-mounted over each in its mount namespace.
# /opt/cni/bin and /run/slipstream too: a CNI plugin a DaemonSet installs
# (Slipstream's) and the files it shares with its node proxy are each
# node's own, as on machines of their own.
KEEP_FILE=/run/slipstream/.kube-harness
NODE_PATHS="/var/lib/kubelet /var/log/pods /var/log/containers /var/lib/containerd /run/containerd /var/lib/cni /etc/cni/net.d /opt/cni/bin /run/slipstream"

log() { echo "kube-cluster.sh: $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

need_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces, mounts, cgroups)"
}

# The v1 hierarchies and cgroup2, from /proc/mounts (never assumed).
cgroup_mounts() {
  awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/mounts
}

bin() { echo "$KUBE_CACHE/bin/$1"; }

# Whether process `$1` runs (a zombie, which kill -0 still finds, does not).
alive() {
  local state
  state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# ---------------------------------------------------------------- certificates

# A key and a certificate signed by the cluster CA: name, subject, and the
# extensions (SANs) of a server certificate or none.
issue() {
  local name=$1 subject=$2 san=${3:-}
  local d="$STATE/pki"
  [ -f "$d/$name.crt" ] && return 0
  openssl genrsa -out "$d/$name.key" 2048 2>/dev/null
  openssl req -new -key "$d/$name.key" -subj "$subject" -out "$d/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [ -n "$san" ]; then
      echo "extendedKeyUsage=serverAuth,clientAuth"
      echo "subjectAltName=$san"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } >"$d/$name.ext"
  openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -days 365 -sha256 -extfile "$d/$name.ext" -out "$d/$name.crt" 2>/dev/null
  rm -f "$d/$name.csr" "$d/$name.ext"
}

make_pki() {
  local d="$STATE/pki"
  mkdir -p "$d"
  chmod 700 "$d"
  if [ ! -f "$d/ca.crt" ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$d/ca.key" -out "$d/ca.crt" -days 365 \
      -subj "/CN=slipstream-kube-harness-ca" 2>/dev/null
  fi
  issue apiserver "/CN=kube-apiserver" \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$CLUSTER_DOMAIN,DNS:localhost,IP:$CP_IP,IP:$API_SERVICE_IP,IP:127.0.0.1"
  issue apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  issue admin "/O=system:masters/CN=kubernetes-admin"
  issue controller-manager "/CN=system:kube-controller-manager"
  issue scheduler "/CN=system:kube-scheduler"
  issue kube-proxy "/CN=system:kube-proxy"
  issue coredns "/CN=slipstream-kube-harness:coredns"
  for n in $NODES; do
    issue "kubelet-$n" "/O=system:nodes/CN=system:node:$n"
  done
  if [ ! -f "$d/sa.key" ]; then
    openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
    openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
  fi
}

# A kubeconfig for the client certificate `name`.
kubeconfig() {
  local name=$1 out=$2
  cat >"$out" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kube-harness
  cluster:
    certificate-authority: $STATE/pki/ca.crt
    server: https://$CP_IP:6443
users:
- name: $name
  user:
    client-certificate: $STATE/pki/$name.crt
    client-key: $STATE/pki/$name.key
contexts:
- name: kube-harness
  context: {cluster: kube-harness, user: $name}
current-context: kube-harness
EOF
}

# ------------------------------------------------------------------- network

# The machine is no pod's business: nothing from the pod CIDR may reach
# it (its services, the registry, whose pushes would replace every node's
# images), and only the nodes and the machine itself reach the registry.
# (Without it a pod's packets reach the machine, and its answers leave by
# the machine's default route: there is no route back to the pods.) One
# nftables table, replaced whole on every `up`, deleted by `down`.
NFT_TABLE=slipstream_kube_harness
guard_machine() {
  nft -f - <<EOF
table inet $NFT_TABLE
delete table inet $NFT_TABLE
table inet $NFT_TABLE {
  chain input {
    type filter hook input priority 0; policy accept;
    ip saddr $CLUSTER_CIDR counter drop
    ip daddr $HOST_IP tcp dport ${REGISTRY##*:} ip saddr != $NET_PREFIX.0/24 counter drop
  }
}
EOF
}

make_network() {
  guard_machine
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$HOST_IP/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
  fi
  for n in $NODES; do
    local ns
    ns=$(netns_of "$n")
    if ! [ -e "/run/netns/$ns" ]; then
      ip netns add "$ns"
    fi
    local veth
    veth=$(veth_of "$n")
    if ! ip link show "$veth" >/dev/null 2>&1; then
      ip link add "$veth" type veth peer name eth0 netns "$ns"
      ip link set "$veth" master "$BRIDGE" up
      ip -n "$ns" addr add "$(node_ip "$n")/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" link set lo up
      ip -n "$ns" route add default via "$HOST_IP"
    fi
    # A new network namespace forwards nothing; bridged pod traffic must
    # meet kube-proxy's rules (Service replies between pods of one node).
    ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
    ip netns exec "$ns" sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
    for m in $NODES; do
      [ "$m" = "$n" ] && continue
      ip -n "$ns" route replace "$(node_cidr "$m")" via "$(node_ip "$m")"
    done
  done
}

# ------------------------------------------------------------ mount namespaces

# $RUN/mnt holds one file per node that keeps its mount namespace alive; it
# must be a private mount for a namespace to be bound to a file in it.
make_mount_namespaces() {
  mkdir -p "$RUN/mnt"
  if ! mountpoint -q "$RUN/mnt"; then
    mount --bind "$RUN/mnt" "$RUN/mnt"
  fi
  mount --make-private "$RUN/mnt"
  # The machine's /run/slipstream (the local cluster's run directory) is
  # under every node's own: a local cluster that removes it when empty
  # would detach the nodes' mounts there (rmdir of a mountpoint of another
  # mount namespace detaches it). A file of ours keeps it from being empty.
  if [ ! -e /run/slipstream ]; then
    mkdir -p /run/slipstream
    echo /run/slipstream >>"$STATE/made-paths"
  fi
  touch "$KEEP_FILE"
  for n in $NODES; do
    local f="$RUN/mnt/$n" dir="$STATE/nodes/$n"
    if [ -f "$f" ] && nsenter --mount="$f" true 2>/dev/null; then
      continue
    fi
    touch "$f"
    for p in $NODE_PATHS; do
      mkdir -p "$dir/paths$p"
      if [ ! -e "$p" ]; then
        mkdir -p "$p"
        echo "$p" >>"$STATE/made-paths"
      fi
    done
    mkdir -p "$dir/sysctl"
    for s in $SHIELDED_SYSCTLS; do
      local copy="$dir/sysctl/${s//\//.}"
      [ -f "$copy" ] || cat "/proc/sys/$s" >"$copy"
    done
    # A private copy of the machine's mounts, then the node's own paths
    # and kernel settings over it.
    unshare --mount="$f" --propagation private sh -c "
      set -e
      for p in $NODE_PATHS; do mount --bind '$dir/paths'\$p \$p; done
      for s in $SHIELDED_SYSCTLS; do mount --bind '$dir/sysctl/'\$(echo \$s | tr / .) /proc/sys/\$s; done
      # Pods' network namespaces are files containerd makes in /run/netns:
      # in a tmpfs of the node's own, they go when the node goes, instead
      # of staying behind as empty files in the machine's /run/netns.
      mkdir -p /run/netns
      mount -t tmpfs -o mode=0755 kh-netns /run/netns
      # Every mount of the node shared (peer groups of the node's own, not
      # the machine's), as systemd leaves a real node's root: pods may
      # mount host paths with HostToContainer propagation (a node proxy
      # opening pods' network namespaces made after it started), and the
      # kubelet's root propagates to pods.
      mount --make-rshared /
    "
  done
}

# Runs `$@` in node `$1`'s network and mount namespaces, in the background,
# its output in $STATE/logs/<node>-<name>.log, its pid in $RUN/pids.
start() {
  local node=$1 name=$2
  shift 2
  local pidfile="$RUN/pids/$node-$name"
  if [ -f "$pidfile" ] && alive "$(cat "$pidfile")"; then
    return 0
  fi
  mkdir -p "$RUN/pids" "$STATE/logs"
  nsenter --net="/run/netns/$(netns_of "$node")" --mount="$RUN/mnt/$node" -- \
    setsid "$@" >>"$STATE/logs/$node-$name.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
}

# Waits until `$2` (a command) succeeds, at most `$3` seconds, naming `$1`.
wait_for() {
  local what=$1 cmd=$2 secs=$3 logfile=${4:-}
  local i=0
  until eval "$cmd" >/dev/null 2>&1; do
    i=$((i + 1))
    if [ "$i" -gt $((secs * 2)) ]; then
      log "$what did not come up within ${secs}s"
      if [ -n "$logfile" ] && [ -f "$logfile" ]; then
        log "last lines of $logfile:"
        tail -n 20 "$logfile" >&2
      fi
      exit 1
    fi
    sleep 0.5
  done
}

# ------------------------------------------------------------------- bpffs

# The BPF filesystem at /sys/fs/bpf, before the nodes' mount namespaces copy
# the machine's mounts: a node's eBPF datapath pins its maps and links there
# (each node in its own directory, ${BPF_PREFIX}<node>, the chart's
# datapath.bpfDir on the harness). Mounted only when absent, and left
# mounted (other users of the machine may pin there too).
BPF_PREFIX=/sys/fs/bpf/slipstream/kh-
ensure_bpffs() {
  if ! awk '$2 == "/sys/fs/bpf" && $3 == "bpf" { found = 1 } END { exit !found }' /proc/mounts; then
    mount -t bpf bpf /sys/fs/bpf
    log "mounted the BPF filesystem at /sys/fs/bpf"
  fi
}

# ------------------------------------------------------------------ cgroups

make_cgroup_roots() {
  for m in $(cgroup_mounts); do
    for n in $NODES; do
      local cg="$m/kh-$n"
      mkdir -p "$cg"
      if [ -f "$m/cpuset.cpus" ] && [ ! -s "$cg/cpuset.cpus" ]; then
        cat "$m/cpuset.cpus" >"$cg/cpuset.cpus"
        cat "$m/cpuset.mems" >"$cg/cpuset.mems"
      fi
    done
  done
}

# ------------------------------------------------------------- node configs

write_node_configs() {
  local n=$1 dir="$STATE/nodes/$1"
  mkdir -p "$dir"
  # The node's CNI plugins (Debian's), in its own /opt/cni/bin.
  mkdir -p "$dir/paths/opt/cni/bin"
  for p in bridge host-local loopback; do
    install -m 0755 "/usr/lib/cni/$p" "$dir/paths/opt/cni/bin/$p"
  done
  kubeconfig "kubelet-$n" "$dir/kubelet.kubeconfig"
  cat >"$dir/containerd.toml" <<EOF
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This machine denies lowering an oom_score_adj (no CAP_SYS_RESOURCE),
  # and the kubelet asks -998 for every sandbox: without this, runc fails
  # every pod with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$STATE/registry-hosts"
EOF
  cat >"$dir/paths/etc/cni/net.d/10-kube-harness.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "kube-harness",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$(node_cidr "$n")"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
  cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /kh-$n
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
# The machine's settings are shielded (a copy per node), and left as they are.
protectKernelDefaults: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization: {mode: Webhook}
clusterDomain: $CLUSTER_DOMAIN
clusterDNS: [$CP_IP]
resolvConf: $STATE/resolv.conf
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
# The disk is shared with everything else on the machine: never evict,
# never delete an image (none can be pulled from outside).
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}
serializeImagePulls: false
maxPods: 60
EOF
  cat >"$dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/kube-proxy.kubeconfig}
hostnameOverride: $n
mode: nftables
clusterCIDR: $CLUSTER_CIDR
bindAddress: $(node_ip "$n")
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# nf_conntrack_max and the timeouts are the machine's, read-only outside
# its first network namespace.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
}

write_registry_hosts() {
  # Every public name the cluster pulls resolves to the harness registry,
  # as in an air-gapped cluster.
  for r in docker.io registry.k8s.io ghcr.io quay.io "$REGISTRY"; do
    local upstream
    case $r in
      docker.io) upstream=https://registry-1.docker.io ;;
      "$REGISTRY") upstream=http://$REGISTRY ;;
      *) upstream=https://$r ;;
    esac
    mkdir -p "$STATE/registry-hosts/$r"
    cat >"$STATE/registry-hosts/$r/hosts.toml" <<EOF
server = "$upstream"

[host."http://$REGISTRY"]
  capabilities = ["pull", "resolve"]
  skip_verify = true
EOF
  done
}

# --------------------------------------------------------------------- up

cmd_up() {
  need_root
  for t in containerd runc ctr etcd openssl nft conntrack docker-registry; do
    command -v "$t" >/dev/null || die "$t is missing; run scripts/setup.sh (it installs the harness's Debian packages)"
  done
  [ -x /usr/lib/cni/bridge ] || die "the CNI plugins are missing (/usr/lib/cni); run scripts/setup.sh"
  local started
  started=$(date +%s)
  "$ROOT/scripts/kube-build.sh" >/dev/null
  mkdir -p "$STATE" "$RUN/pids" "$STATE/logs"
  chmod 700 "$STATE"
  printf 'nameserver %s\nsearch %s\n' "$CP_IP" "$CLUSTER_DOMAIN" >"$STATE/resolv.conf"
  make_pki
  kubeconfig admin "$STATE/admin.kubeconfig"
  kubeconfig controller-manager "$STATE/controller-manager.kubeconfig"
  kubeconfig scheduler "$STATE/scheduler.kubeconfig"
  kubeconfig kube-proxy "$STATE/kube-proxy.kubeconfig"
  kubeconfig coredns "$STATE/coredns.kubeconfig"
  write_registry_hosts
  make_network
  ensure_bpffs
  make_mount_namespaces
  make_cgroup_roots
  for n in $NODES; do
    write_node_configs "$n"
  done
  mkdir -p "$STATE/bin"
  ln -sfn "$(bin kubectl)" "$STATE/bin/kubectl"
  ln -sfn "$(bin helm)" "$STATE/bin/helm"
  [ -x "$(bin helm4)" ] && ln -sfn "$(bin helm4)" "$STATE/bin/helm4"

  # The registry, on the harness bridge only.
  mkdir -p "$STATE/registry"
  cat >"$STATE/registry.yml" <<EOF
version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: $STATE/registry}
  delete: {enabled: true}
http: {addr: "$REGISTRY"}
EOF
  if ! [ -f "$RUN/pids/registry" ] || ! alive "$(cat "$RUN/pids/registry")"; then
    setsid docker-registry serve "$STATE/registry.yml" >>"$STATE/logs/registry.log" 2>&1 </dev/null &
    echo $! >"$RUN/pids/registry"
  fi

  log "control plane on $CP_IP"
  start control-plane etcd etcd --name kube-harness --data-dir "$STATE/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster kube-harness=http://127.0.0.1:2380
  local p="$STATE/pki"
  start control-plane kube-apiserver "$(bin kube-apiserver)" \
    --etcd-servers=http://127.0.0.1:2379 \
    --advertise-address="$CP_IP" --bind-address=0.0.0.0 --secure-port=6443 \
    --service-cluster-ip-range="$SERVICE_CIDR" --allow-privileged=true \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --client-ca-file="$p/ca.crt" --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
    --kubelet-client-certificate="$p/apiserver-kubelet-client.crt" --kubelet-client-key="$p/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer="https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
    --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
    --profiling=false
  local kc="$(bin kubectl) --kubeconfig $STATE/admin.kubeconfig"
  wait_for "kube-apiserver" "$kc get --raw /readyz" 120 "$STATE/logs/control-plane-kube-apiserver.log"
  start control-plane kube-controller-manager "$(bin kube-controller-manager)" \
    --kubeconfig="$STATE/controller-manager.kubeconfig" --leader-elect=false --bind-address=127.0.0.1 \
    --service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" \
    --cluster-signing-cert-file="$p/ca.crt" --cluster-signing-key-file="$p/ca.key" \
    --use-service-account-credentials=true --service-cluster-ip-range="$SERVICE_CIDR" \
    --profiling=false
  start control-plane kube-scheduler "$(bin kube-scheduler)" \
    --kubeconfig="$STATE/scheduler.kubeconfig" --leader-elect=false --bind-address=127.0.0.1 --profiling=false

  # CoreDNS reads Services and EndpointSlices as its own user.
  $kc apply -f - >/dev/null <<'EOF'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "slipstream-kube-harness:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "slipstream-kube-harness:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "slipstream-kube-harness:coredns"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "slipstream-kube-harness:coredns"}
EOF
  cat >"$STATE/Corefile" <<EOF
.:53 {
    bind $CP_IP
    errors
    kubernetes $CLUSTER_DOMAIN in-addr.arpa ip6.arpa {
        kubeconfig $STATE/coredns.kubeconfig kube-harness
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
EOF
  start control-plane coredns "$(bin coredns)" -conf "$STATE/Corefile"

  for n in $NODES; do
    log "node $n on $(node_ip "$n"), pods in $(node_cidr "$n")"
    start "$n" containerd containerd --config "$STATE/nodes/$n/containerd.toml"
  done
  for n in $NODES; do
    wait_for "containerd of $n" \
      "nsenter --mount=$RUN/mnt/$n ctr --address /run/containerd/containerd.sock version" 30 \
      "$STATE/logs/$n-containerd.log"
    start "$n" kubelet "$(bin kubelet)" --config="$STATE/nodes/$n/kubelet.yaml" \
      --kubeconfig="$STATE/nodes/$n/kubelet.kubeconfig" \
      --hostname-override="$n" --node-ip="$(node_ip "$n")"
    start "$n" kube-proxy "$(bin kube-proxy)" --config="$STATE/nodes/$n/kube-proxy.yaml"
  done
  for n in $NODES; do
    wait_for "node $n to be Ready" \
      "$kc get node $n -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True" 120 \
      "$STATE/logs/$n-kubelet.log"
  done
  # Workloads on the workers only, as on a real control plane.
  $kc taint node control-plane node-role.kubernetes.io/control-plane=:NoSchedule --overwrite >/dev/null
  $kc label node control-plane node-role.kubernetes.io/control-plane= --overwrite >/dev/null
  log "up in $(($(date +%s) - started))s; use it with: eval \"\$(scripts/kube-cluster.sh env)\""
  $kc get nodes -o wide >&2
}

# -------------------------------------------------------------------- down

cmd_down() {
  need_root
  # Every process of the harness: those it started, then anything left in
  # the nodes' network namespaces (containerd shims), then in their cgroup
  # roots (containers, in pod network namespaces of their own).
  if [ -d "$RUN/pids" ]; then
    for f in "$RUN"/pids/*; do
      [ -f "$f" ] || continue
      kill "$(cat "$f")" 2>/dev/null || true
    done
    sleep 1
    for f in "$RUN"/pids/*; do
      [ -f "$f" ] || continue
      kill -9 "$(cat "$f")" 2>/dev/null || true
      rm -f "$f"
    done
  fi
  for n in $NODES; do
    local ns
    ns=$(netns_of "$n")
    if [ -e "/run/netns/$ns" ]; then
      ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    fi
  done
  for m in $(cgroup_mounts); do
    for cg in "$m"/kh-*; do
      [ -d "$cg" ] || continue
      find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    done
  done
  # A node's eBPF datapath left pinned (an agent killed before an
  # uninstall): its links detach, its maps go, with their pins.
  for d in "$BPF_PREFIX"*; do
    [ -d "$d" ] && rm -rf "$d"
  done
  # Their parent too, once empty (another datapath's pins keep it).
  rmdir "$(dirname "$BPF_PREFIX")" 2>/dev/null || true
  sleep 0.5
  for m in $(cgroup_mounts); do
    for cg in "$m"/kh-*; do
      [ -d "$cg" ] || continue
      # Deepest first: a cgroup is removed only once empty of children.
      find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
      [ -d "$cg" ] && log "WARNING: could not remove cgroup $cg"
    done
  done
  # Mount namespaces: once no process holds one, unmounting its file ends it
  # and every mount in it (pod volumes, container root filesystems).
  if [ -d "$RUN/mnt" ]; then
    for f in "$RUN"/mnt/*; do
      [ -e "$f" ] || continue
      umount "$f" 2>/dev/null || umount -l "$f" 2>/dev/null || true
      rm -f "$f"
    done
    umount "$RUN/mnt" 2>/dev/null || true
  fi
  # Pods' network namespaces are made by the CNI plugin under /run/netns
  # only inside a node's mount namespace, so they went with it; veths too.
  for n in $NODES; do
    local ns
    ns=$(netns_of "$n")
    # The veth first: deleting it takes its peer (eth0) out of the node.
    if ip link show "$(veth_of "$n")" >/dev/null 2>&1; then ip link del "$(veth_of "$n")" 2>/dev/null || true; fi
    if [ -e "/run/netns/$ns" ]; then ip netns del "$ns"; fi
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
  nft delete table inet "$NFT_TABLE" 2>/dev/null || true
  rm -f "$KEEP_FILE"
  if [ -f "$STATE/made-paths" ]; then
    sort -r "$STATE/made-paths" | while read -r p; do rmdir "$p" 2>/dev/null || true; done
  fi
  rm -rf "$STATE" "$RUN"
  log "down: nothing of the harness is left"
}

cmd_env() {
  [ -f "$STATE/admin.kubeconfig" ] || die "the harness cluster is not up (scripts/kube-cluster.sh up)"
  echo "export KUBECONFIG=$STATE/admin.kubeconfig"
  echo "export PATH=$STATE/bin:\$PATH"
  echo "export SLIPSTREAM_KH_REGISTRY=$REGISTRY"
}

cmd_status() {
  [ -d "$RUN/pids" ] || {
    echo "down"
    return 0
  }
  for f in "$RUN"/pids/*; do
    local name state
    name=$(basename "$f")
    if alive "$(cat "$f")"; then state=running; else state=exited; fi
    printf '%-36s %s (pid %s)\n' "$name" "$state" "$(cat "$f")"
  done
  "$(bin kubectl)" --kubeconfig "$STATE/admin.kubeconfig" get nodes -o wide 2>&1 || true
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  env) cmd_env ;;
  status) cmd_status ;;
  *)
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
