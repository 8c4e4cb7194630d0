//! The node proxy's one configuration struct: parsed once from flags and
//! environment, served back at `/config_dump`.

use serde::Serialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
pub struct NodeArgs {
    /// Name of the node this proxy serves (its pods are listed in
    /// CONFIG_DIR/<node>/pods.json).
    #[arg(long, env = "SLIPSTREAM_NODE")]
    pub node: String,
    /// Directory with workloads.json (the mesh) and <node>/pods.json (this
    /// node's pods); written by the control plane or the local cluster.
    #[arg(long, env = "SLIPSTREAM_CONFIG_DIR")]
    pub config_dir: PathBuf,
    /// Directory with root-cert.pem and root-key.pem of the local CA.
    /// Only without --control-plane (the proxy then signs its own pods'
    /// certificates: for tests of the node proxy alone).
    #[arg(long, env = "SLIPSTREAM_CA_DIR")]
    pub ca_dir: Option<PathBuf>,
    /// The control plane (`host:port`, its port 15012): the workload API
    /// over delta xDS and the certificate service. Repeat it for replicas;
    /// the proxy fails over between them.
    #[arg(long = "control-plane", env = "SLIPSTREAM_CONTROL_PLANE", value_delimiter = ',')]
    pub control_plane: Vec<String>,
    /// The name the control plane's certificate must carry.
    #[arg(long, default_value = slipstream_api::DEFAULT_CONTROL_PLANE_SAN)]
    pub control_plane_san: String,
    /// PEM file with the mesh root certificate(s) the control plane's
    /// certificate chains to.
    #[arg(long, env = "SLIPSTREAM_CONTROL_PLANE_ROOT")]
    pub control_plane_root: Option<PathBuf>,
    /// File with this node's bearer token for the control plane.
    #[arg(long, env = "SLIPSTREAM_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Access-log format: plain or json (`SLIPSTREAM_ACCESS_LOG=json
    /// slipstream up` sets it for every node proxy of a local cluster).
    #[arg(long, env = "SLIPSTREAM_ACCESS_LOG", default_value = "plain", value_parser = ["plain", "json"])]
    pub log_format: String,
    /// Admin server (config dump); keep it on loopback.
    #[arg(long, default_value = "127.0.0.1:15000")]
    pub admin_addr: SocketAddr,
    /// Prometheus metrics (/metrics).
    #[arg(long, default_value = "0.0.0.0:15020")]
    pub stats_addr: SocketAddr,
    /// Readiness (/healthz/ready).
    #[arg(long, default_value = "0.0.0.0:15021")]
    pub readiness_addr: SocketAddr,
    /// Workload certificate lifetime, in hours (renewed at half-life).
    #[arg(long, default_value_t = 24)]
    pub cert_hours: u64,
    /// Also enforce NetworkPolicy and CiliumNetworkPolicy for this node's
    /// pods outside the mesh, in the node's kernel forward path (an
    /// nftables table, `inet slipstream_netpol`, in the proxy's network
    /// namespace: run it in the node's). Meshed pods are always decided by
    /// the proxy itself. `slipstream up` turns it on.
    #[arg(long, env = "SLIPSTREAM_NODE_NETPOL_KERNEL")]
    pub netpol_kernel: bool,
    /// How pods' traffic reaches this proxy: `nftables` (rules in each
    /// pod's namespace; the original destination from conntrack) or `ebpf`
    /// (the programs the CNI attached: the original destination and the
    /// inbound listener in the pinned maps of --bpf-dir, and the policy
    /// map filled from this proxy's engine). `slipstream up` chooses.
    #[arg(long, env = "SLIPSTREAM_NODE_DATAPATH", default_value = "nftables", value_parser = ["nftables", "ebpf"])]
    pub datapath: String,
    /// The cluster's bpffs directory, with `--datapath ebpf` (default
    /// `/sys/fs/bpf/slipstream/<cluster>`).
    #[arg(long, env = "SLIPSTREAM_NODE_BPF_DIR")]
    pub bpf_dir: Option<PathBuf>,
    /// This node's index in the datapath's per-node counters (0-63).
    #[arg(long, env = "SLIPSTREAM_NODE_DATAPATH_INDEX", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..64))]
    pub datapath_index: u16,
    /// Threads, each with its own single-threaded runtime: accepted
    /// connections are spread over them round robin, and each keeps its
    /// own pooled HBONE connections, so a connection never crosses threads.
    /// 1 runs everything on one thread (at most one core).
    #[arg(long, env = "SLIPSTREAM_NODE_WORKERS", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: u16,
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// Overrides of the limits of docs/node-proxy.md ("Limits"); unset ones
/// are derived from the open-file limit.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LimitArgs {
    /// Descriptors all proxied connections together may hold (default: the
    /// open-file limit less a reserve for listeners, tunnels and admin).
    #[arg(long, env = "SLIPSTREAM_NODE_CONNECTION_BUDGET")]
    pub connection_budget: Option<u32>,
    /// Outbound connections one local pod may hold open (default: a quarter
    /// of the budget, at most 4096).
    #[arg(long, env = "SLIPSTREAM_NODE_POD_CONNECTIONS")]
    pub pod_connections: Option<u32>,
    /// Outbound connections of one local pod still being set up (connect,
    /// HBONE handshake, CONNECT answer).
    #[arg(long, env = "SLIPSTREAM_NODE_POD_PENDING")]
    pub pod_pending: Option<u32>,
    /// Open HBONE connections on :15008 per peer IP (default: twice what
    /// its streams need at 100 per connection, at least 16).
    #[arg(long, env = "SLIPSTREAM_NODE_PEER_CONNECTIONS")]
    pub peer_connections: Option<u32>,
    /// TLS and HTTP/2 handshakes in progress on :15008 per peer IP.
    #[arg(long, env = "SLIPSTREAM_NODE_PEER_HANDSHAKES")]
    pub peer_handshakes: Option<u32>,
    /// Open CONNECT streams per peer IP, across all its tunnels (default: a
    /// quarter of the budget, at most 4096).
    #[arg(long, env = "SLIPSTREAM_NODE_PEER_STREAMS")]
    pub peer_streams: Option<u32>,
    /// Open plaintext connections on :15006 per peer IP (default: an eighth
    /// of the budget, at most 2048: two descriptors each).
    #[arg(long, env = "SLIPSTREAM_NODE_PEER_PLAINTEXT")]
    pub peer_plaintext: Option<u32>,
    /// Open connections per admin listener (:15000, :15020, :15021).
    #[arg(long, env = "SLIPSTREAM_NODE_ADMIN_CONNECTIONS")]
    pub admin_connections: Option<u32>,
    /// Open connections per admin listener and source IP.
    #[arg(long, env = "SLIPSTREAM_NODE_ADMIN_CONNECTIONS_PER_SOURCE")]
    pub admin_connections_per_source: Option<u32>,
    /// How long a client of an admin port has to send a request's headers.
    #[arg(long, env = "SLIPSTREAM_NODE_ADMIN_HEADER_TIMEOUT", value_parser = parse_duration)]
    pub admin_header_timeout: Option<Duration>,
    /// How long any connection to an admin port may last.
    #[arg(long, env = "SLIPSTREAM_NODE_ADMIN_CONNECTION_DEADLINE", value_parser = parse_duration)]
    pub admin_connection_deadline: Option<Duration>,
    /// Bytes all connections may buffer together (read and not yet written
    /// out, inbound tunnels' receive windows), shared fairly by the pods
    /// (docs/node-proxy.md, "Memory: the buffer budget"): `256Mi`, `1Gi`,
    /// or bytes. Default: half the proxy's cgroup memory limit, or 1 GiB
    /// without one.
    #[arg(long, env = "SLIPSTREAM_NODE_BUFFER_BUDGET", value_parser = parse_bytes)]
    pub buffer_budget: Option<u64>,
    /// Refusal log lines per source and second; the rest are summarised.
    #[arg(long, env = "SLIPSTREAM_NODE_REFUSAL_LOG_BURST")]
    pub refusal_log_burst: Option<u32>,
}

/// Every bound of the node proxy, as served at `/config_dump`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Limits {
    /// RLIMIT_NOFILE (soft, after raising it to the hard limit).
    pub open_files: u64,
    /// Descriptors kept out of the budget: in-pod listeners, outbound HBONE
    /// tunnels, admin connections, the log and configuration files.
    pub reserved_files: u64,
    /// Descriptors all proxied connections may hold together: one per
    /// outbound or inbound-HBONE connection, two per passthrough or
    /// plaintext connection, one per inbound HBONE connection.
    pub connection_budget: u32,
    pub pod_connections: u32,
    pub pod_pending: u32,
    pub peer_connections: u32,
    pub peer_handshakes: u32,
    pub peer_streams: u32,
    pub peer_plaintext: u32,
    pub admin_connections: u32,
    pub admin_connections_per_source: u32,
    #[serde(serialize_with = "as_secs")]
    pub admin_header_timeout: Duration,
    #[serde(serialize_with = "as_secs")]
    pub admin_connection_deadline: Duration,
    pub refusal_log_burst: u32,
    /// Bytes all connections' bulk buffers may hold together (the memory
    /// budget, shared fairly by the pods: `limits::Buffers`).
    pub buffer_budget: u64,
}

/// The buffer budget without a flag or a cgroup memory limit.
pub const DEFAULT_BUFFER_BUDGET: u64 = 1 << 30;

/// The buffer budget for a proxy whose cgroup allows `memory_limit` bytes:
/// half of it (the rest for its connections' fixed costs, TLS and the
/// runtime), or [`DEFAULT_BUFFER_BUDGET`] without a limit.
pub fn buffer_budget_for(memory_limit: Option<u64>) -> u64 {
    memory_limit.map_or(DEFAULT_BUFFER_BUDGET, |m| m / 2)
}

/// `256Mi`, `1Gi`, `512Ki`, `64M`, `1G` or a number of bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("{s:?} is not a size (e.g. 256Mi, 1Gi, 1048576)"))?;
    let k: u64 = match unit.trim() {
        "" | "B" => 1,
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        "K" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        u => return Err(format!("{s:?}: unknown unit {u:?} (Ki, Mi, Gi, K, M, G)")),
    };
    n.checked_mul(k).filter(|b| *b > 0).ok_or_else(|| format!("{s:?}: must be more than 0 and fit 64 bits"))
}

pub(crate) fn as_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Limits {
    /// The limits for a process that may open `open_files` descriptors.
    /// Pure: the table test below shows the defaults.
    pub fn derive(open_files: u64, a: &LimitArgs) -> Limits {
        // A tenth for what is not a proxied connection, at least 512.
        let reserved_files = (open_files / 10).max(512).min(open_files);
        let derived = u32::try_from(open_files - reserved_files).unwrap_or(u32::MAX);
        let connection_budget = a.connection_budget.unwrap_or(derived);
        // One source may take a quarter of the node (three others as greedy
        // still leave room for the rest), and never more than a fixed
        // number, so what one source can make the proxy buffer is bounded
        // whatever RLIMIT_NOFILE is (docs/node-proxy.md "Limits" has the
        // worst case in bytes).
        let quarter = (connection_budget / 4).max(1);
        let pod_connections = a.pod_connections.unwrap_or(quarter.min(MAX_PER_SOURCE));
        let peer_streams = a.peer_streams.unwrap_or(quarter.min(MAX_PER_SOURCE));
        Limits {
            open_files,
            reserved_files,
            connection_budget,
            pod_connections,
            pod_pending: a.pod_pending.unwrap_or(pod_connections.min(512)),
            // Enough tunnels for the peer's streams at the pool's 100 per
            // connection, twice over, and at least 16.
            peer_connections: a.peer_connections.unwrap_or(peer_streams.div_ceil(100).saturating_mul(2).max(16)),
            peer_handshakes: a.peer_handshakes.unwrap_or(64),
            peer_streams,
            // Two descriptors each (client and app): half as many for the
            // same quarter of the budget.
            peer_plaintext: a.peer_plaintext.unwrap_or((quarter / 2).clamp(1, MAX_PER_SOURCE / 2)),
            admin_connections: a.admin_connections.unwrap_or(128),
            admin_connections_per_source: a.admin_connections_per_source.unwrap_or(16),
            admin_header_timeout: a.admin_header_timeout.unwrap_or(Duration::from_secs(5)),
            admin_connection_deadline: a.admin_connection_deadline.unwrap_or(Duration::from_secs(30)),
            refusal_log_burst: a.refusal_log_burst.unwrap_or(5),
            buffer_budget: a.buffer_budget.unwrap_or(DEFAULT_BUFFER_BUDGET),
        }
    }
}

/// The most connections (or streams) one source holds by default, whatever
/// the open-file limit.
pub const MAX_PER_SOURCE: u32 = 4096;

/// A duration flag (`--timeout`): one number, integer or decimal, with
/// unit `ms`, `s`, `m` or `h`, or none for seconds (`3` is `3s`). The form
/// is checked here, so that the flags take what they always took (humantime
/// alone would also take `1m30s` or `2 min`, and not `3`); humantime
/// computes the value exactly, refusing what overflows and what it cannot
/// represent (a fraction of a nanosecond, a fraction of an hour that is not
/// whole seconds) rather than rounding.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len()));
    let num = humantime_decimal(num).ok_or_else(|| format!("{s:?} is not a duration (examples: 30s, 2m, 500ms)"))?;
    let unit = match unit {
        "" => "s",
        "ms" | "s" | "m" | "h" => unit,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    humantime::parse_duration(&format!("{num}{unit}")).map_err(|e| format!("{s:?}: {e}"))
}

/// A decimal written with digits and at most one dot (`5`, `1.5`, `.5`,
/// `5.`) as humantime reads one (`5`, `1.5`, `0.5`, `5`; trailing zeros of
/// the fraction dropped, which humantime counts against its precision);
/// None for anything else (pure).
fn humantime_decimal(num: &str) -> Option<String> {
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty()) || !(int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())) {
        return None;
    }
    let int = if int.is_empty() { "0" } else { int };
    Some(match frac.trim_end_matches('0') {
        "" => int.to_owned(),
        frac => format!("{int}.{frac}"),
    })
}

/// Everything about the HBONE client pool (PROTOCOLS.md section 2).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PoolSettings {
    pub max_streams_per_connection: usize,
    #[serde(serialize_with = "as_secs")]
    pub idle_timeout: Duration,
    /// TCP + TLS + HTTP/2 handshakes toward a peer.
    #[serde(serialize_with = "as_secs")]
    pub connect_timeout: Duration,
    /// Waiting for the answer to a CONNECT (longer than the peer's 10 s
    /// upstream connect).
    #[serde(serialize_with = "as_secs")]
    pub response_timeout: Duration,
}

/// HTTP/2 settings of tunnels, both directions (PROTOCOLS.md section 2).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct H2Settings {
    pub stream_window: u32,
    pub connection_window: u32,
    pub max_frame_size: u32,
    pub max_header_list_size: u32,
    pub max_send_buffer: usize,
    #[serde(serialize_with = "as_secs")]
    pub keepalive_interval: Duration,
    #[serde(serialize_with = "as_secs")]
    pub keepalive_timeout: Duration,
}

/// The HBONE server of every pod (:15008).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ServerSettings {
    pub max_concurrent_streams: u32,
    #[serde(serialize_with = "as_secs")]
    pub handshake_timeout: Duration,
}

/// Workload certificates.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CertSettings {
    /// Lifetime of issued certificates; renewed at half of it.
    #[serde(serialize_with = "as_secs")]
    pub validity: Duration,
    /// First delay after a failed fetch; doubles up to `max_retry`.
    #[serde(serialize_with = "as_secs")]
    pub initial_retry: Duration,
    #[serde(serialize_with = "as_secs")]
    pub max_retry: Duration,
    #[serde(serialize_with = "as_secs")]
    pub min_refresh: Duration,
}

/// Timeouts of the proxy's own lifecycle and data path.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Timeouts {
    /// Upstream connect (inbound to the app, passthrough): 503 after it.
    #[serde(serialize_with = "as_secs")]
    pub upstream_connect: Duration,
    /// How often the configuration files are checked for changes.
    #[serde(serialize_with = "as_secs")]
    pub poll_interval: Duration,
    /// How long open connections may finish once a drain starts.
    #[serde(serialize_with = "as_secs")]
    pub drain_grace: Duration,
    /// After the grace period, how long connections still open get to
    /// close once told to; then the drain is over, whatever is left.
    #[serde(serialize_with = "as_secs")]
    pub drain_force: Duration,
}

/// The node proxy's one configuration, served whole at `/config_dump`.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub cluster: String,
    pub node: String,
    pub config_dir: PathBuf,
    pub ca_dir: PathBuf,
    pub trust_domain: String,
    pub json_access_log: bool,
    pub admin_addr: SocketAddr,
    pub stats_addr: SocketAddr,
    pub readiness_addr: SocketAddr,
    pub workers: u16,
    pub timeouts: Timeouts,
    pub pool: PoolSettings,
    pub h2: H2Settings,
    pub server: ServerSettings,
    pub certs: CertSettings,
    pub limits: Limits,
    /// The control plane; None: files and a local CA (`ca_dir`).
    pub control: Option<crate::control::ControlSettings>,
    /// Enforce the network policies of this node's pods outside the mesh
    /// in the node's forward path (nftables table `slipstream_netpol`).
    pub netpol_kernel: bool,
    /// `Some` with `--datapath ebpf`: the pinned maps' directory and this
    /// node's counter index.
    pub ebpf: Option<EbpfSettings>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct EbpfSettings {
    pub bpf_dir: PathBuf,
    pub node_index: u16,
}

/// The open-file limit the proxy will run with: raised to the hard limit
/// first (every proxied connection costs one or two descriptors).
fn open_files() -> u64 {
    match crate::sys::rlimit::raise_nofile() {
        Ok(l) => l.soft,
        Err(_) => crate::sys::rlimit::current().map(|l| l.soft).unwrap_or(1024),
    }
}

impl Config {
    pub fn from_args(cluster: &str, a: NodeArgs) -> Config {
        let mut limits = Limits::derive(open_files(), &a.limits);
        if a.limits.buffer_budget.is_none() {
            limits.buffer_budget = buffer_budget_for(crate::sys::cgroup::memory_limit());
        }
        let mut c = Config::defaults(cluster, &a.node, limits);
        c.config_dir = a.config_dir;
        c.ca_dir = a.ca_dir.unwrap_or_default();
        if !a.control_plane.is_empty() {
            c.control = Some(crate::control::ControlSettings {
                addresses: a.control_plane,
                san: a.control_plane_san,
                root_cert: a.control_plane_root.unwrap_or_default(),
                token_file: a.token_file.unwrap_or_default(),
                cluster_id: cluster.to_string(),
                connect_timeout: Duration::from_secs(2),
            });
        }
        c.json_access_log = a.log_format == "json";
        c.netpol_kernel = a.netpol_kernel;
        c.ebpf = (a.datapath == "ebpf").then(|| EbpfSettings {
            bpf_dir: a.bpf_dir.clone().unwrap_or_else(|| PathBuf::from("/sys/fs/bpf/slipstream").join(cluster)),
            node_index: a.datapath_index,
        });
        c.admin_addr = a.admin_addr;
        c.stats_addr = a.stats_addr;
        c.readiness_addr = a.readiness_addr;
        c.workers = a.workers;
        c.certs.validity = Duration::from_secs(a.cert_hours.max(1) * 3600);
        c
    }

    /// Every default of PROTOCOLS.md and docs/node-proxy.md, with `limits`.
    pub fn defaults(cluster: &str, node: &str, limits: Limits) -> Config {
        let h2 = slipstream_hbone::H2Config::default();
        let pool = slipstream_hbone::PoolConfig::default();
        let server = slipstream_hbone::ServerConfig::default();
        let certs = slipstream_identity::CertManagerConfig::default();
        Config {
            cluster: cluster.to_string(),
            node: node.to_string(),
            config_dir: PathBuf::new(),
            ca_dir: PathBuf::new(),
            trust_domain: slipstream_core::DEFAULT_TRUST_DOMAIN.to_string(),
            json_access_log: false,
            netpol_kernel: false,
            ebpf: None,
            admin_addr: "127.0.0.1:15000".parse().expect("literal"),
            stats_addr: "0.0.0.0:15020".parse().expect("literal"),
            readiness_addr: "0.0.0.0:15021".parse().expect("literal"),
            workers: 2,
            timeouts: Timeouts {
                upstream_connect: slipstream_hbone::UPSTREAM_CONNECT_TIMEOUT,
                poll_interval: Duration::from_millis(100),
                drain_grace: Duration::from_secs(5),
                drain_force: Duration::from_secs(1),
            },
            pool: PoolSettings {
                max_streams_per_connection: pool.max_streams_per_connection,
                idle_timeout: pool.idle_timeout,
                connect_timeout: pool.connect_timeout,
                response_timeout: pool.response_timeout,
            },
            h2: H2Settings {
                stream_window: h2.stream_window,
                connection_window: h2.connection_window,
                max_frame_size: h2.max_frame_size,
                max_header_list_size: h2.max_header_list_size,
                max_send_buffer: h2.max_send_buffer,
                keepalive_interval: h2.keepalive_interval,
                keepalive_timeout: h2.keepalive_timeout,
            },
            server: ServerSettings { max_concurrent_streams: server.max_concurrent_streams, handshake_timeout: server.handshake_timeout },
            certs: CertSettings {
                validity: slipstream_identity::DEFAULT_WORKLOAD_VALIDITY,
                initial_retry: certs.initial_retry,
                max_retry: certs.max_retry,
                min_refresh: certs.min_refresh,
            },
            limits,
            control: None,
        }
    }

    pub fn h2_config(&self) -> slipstream_hbone::H2Config {
        let h = &self.h2;
        slipstream_hbone::H2Config {
            stream_window: h.stream_window,
            connection_window: h.connection_window,
            min_connection_window: slipstream_hbone::MIN_CONNECTION_WINDOW.min(h.connection_window),
            max_frame_size: h.max_frame_size,
            max_header_list_size: h.max_header_list_size,
            max_send_buffer: h.max_send_buffer,
            keepalive_interval: h.keepalive_interval,
            keepalive_timeout: h.keepalive_timeout,
        }
    }

    pub fn pool_config(&self) -> slipstream_hbone::PoolConfig {
        let p = &self.pool;
        slipstream_hbone::PoolConfig {
            max_streams_per_connection: p.max_streams_per_connection,
            idle_timeout: p.idle_timeout,
            connect_timeout: p.connect_timeout,
            response_timeout: p.response_timeout,
            h2: self.h2_config(),
        }
    }

    pub fn server_config(&self) -> slipstream_hbone::ServerConfig {
        slipstream_hbone::ServerConfig {
            h2: self.h2_config(),
            max_concurrent_streams: self.server.max_concurrent_streams,
            handshake_timeout: self.server.handshake_timeout,
            ..Default::default()
        }
    }

    pub fn cert_manager_config(&self) -> slipstream_identity::CertManagerConfig {
        let c = &self.certs;
        slipstream_identity::CertManagerConfig { initial_retry: c.initial_retry, max_retry: c.max_retry, min_refresh: c.min_refresh }
    }

    pub fn workloads_file(&self) -> PathBuf {
        self.config_dir.join("workloads.json")
    }
    pub fn pods_file(&self) -> PathBuf {
        self.config_dir.join(&self.node).join("pods.json")
    }
    pub fn served_file(&self) -> PathBuf {
        self.config_dir.join(&self.node).join("served.json")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_derive_from_the_open_file_limit() {
        // (open files, budget, per pod and peer streams, pod pending, peer
        // connections, peer plaintext): a quarter of the budget per source,
        // at most 4096 (plaintext: half, two descriptors each).
        let cases = [
            (20_000, 18_000, 4_096, 512, 82, 2_048),
            (1_024, 512, 128, 128, 16, 64),
            (262_144, 235_930, 4_096, 512, 82, 2_048),
            (1 << 20, 943_719, 4_096, 512, 82, 2_048),
        ];
        for (files, budget, pod, pending, peer_conns, plain) in cases {
            let l = Limits::derive(files, &LimitArgs::default());
            assert_eq!(
                (l.connection_budget, l.pod_connections, l.pod_pending, l.peer_connections, l.peer_streams, l.peer_plaintext),
                (budget, pod, pending, peer_conns, pod, plain),
                "{files} open files"
            );
            assert!(u64::from(l.connection_budget) + l.reserved_files <= files);
            assert!(l.pod_connections * 4 <= l.connection_budget, "a pod leaves room for three more");
            assert!(l.peer_plaintext * 2 * 4 <= l.connection_budget, "so do a peer's plaintext connections, two descriptors each");
            assert!(l.peer_connections * 100 >= l.peer_streams, "tunnels enough for the streams");
        }
    }

    #[test]
    fn overrides_win() {
        let a = LimitArgs { pod_connections: Some(200), admin_header_timeout: Some(Duration::from_millis(300)), ..Default::default() };
        let l = Limits::derive(20_000, &a);
        assert_eq!((l.pod_connections, l.pod_pending, l.admin_header_timeout), (200, 200, Duration::from_millis(300)));
        assert_eq!(l.peer_streams, 4_096, "the others keep their defaults");
        // More streams per peer bring the tunnels they need (the 10k test).
        let l = Limits::derive(20_000, &LimitArgs { peer_streams: Some(10_000), ..Default::default() });
        assert_eq!((l.peer_streams, l.peer_connections), (10_000, 200));
    }

    #[test]
    fn the_defaults_are_the_protocol_s_and_round_trip_to_the_libraries() {
        let c = Config::defaults("c", "node1", Limits::derive(20_000, &LimitArgs::default()));
        assert_eq!((c.h2.stream_window, c.h2.connection_window, c.h2.max_frame_size), (4 << 20, 16 << 20, 1 << 20));
        assert_eq!(c.server.max_concurrent_streams, 200);
        assert_eq!((c.pool.max_streams_per_connection, c.pool.idle_timeout), (100, Duration::from_secs(300)));
        assert_eq!(c.timeouts.upstream_connect, Duration::from_secs(10));
        assert_eq!(c.pool_config().h2.max_header_list_size, c.h2.max_header_list_size);
        let dump = serde_json::to_value(&c).unwrap();
        for key in ["timeouts", "pool", "h2", "server", "certs", "limits", "trust_domain"] {
            assert!(dump.get(key).is_some(), "/config_dump shows {key}: {dump}");
        }
        assert_eq!(dump["pool"]["idle_timeout"], 300.0);
    }

    #[test]
    fn durations() {
        for (s, d) in [("500ms", 500), ("5s", 5000), ("2m", 120_000), ("3", 3000), ("0.5s", 500)] {
            assert_eq!(parse_duration(s), Ok(Duration::from_millis(d)), "{s}");
        }
        assert!(parse_duration("5d").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("x").is_err());
    }
}
