//! The node proxy's one configuration struct: parsed once from flags and
//! environment, served back at `/config_dump`.

use serde::Serialize;
use slipstream_proxy::certs::NodeCa;
use slipstream_proxy::config::{as_secs, buffer_budget_for, LimitArgs, Limits};
use slipstream_proxy::control::{ControlChannel, ControlSettings};
use slipstream_proxy::xds::NodeInfo;
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
    /// With `--datapath ebpf`: write what the programs refused (a denied
    /// connect(), a SYN refused at the destination) to the access log,
    /// naming the deciding policy. One reader per datapath: the local
    /// cluster's agent reads them itself; the Kubernetes chart turns this on
    #[arg(long, env = "SLIPSTREAM_NODE_DATAPATH_DROPS_LOG", default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolValueParser::new())]
    pub datapath_drops_log: bool,
    /// How long to wait at start for the datapath's maps (`--datapath
    /// ebpf`), which the CNI or node agent pins: on Kubernetes the agent
    /// beside this proxy may load them a moment later
    #[arg(long, env = "SLIPSTREAM_NODE_DATAPATH_WAIT", default_value = "60s", value_parser = slipstream_core::duration::parse_flag)]
    pub datapath_wait: Duration,
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

/// Everything about the HBONE client pool (docs/protocols.md section 2).
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

/// HTTP/2 settings of tunnels, both directions (docs/protocols.md section 2).
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
    pub control: Option<ControlSettings>,
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
    /// Log the programs' drops (`kernel_drops`).
    pub log_drops: bool,
    /// How long the maps are waited for at start.
    #[serde(serialize_with = "as_secs")]
    pub wait: Duration,
}

/// The open-file limit the proxy will run with: raised to the hard limit
/// first (every proxied connection costs one or two descriptors).
fn open_files() -> u64 {
    match slipstream_proxy::sys::rlimit::raise_nofile() {
        Ok(l) => l.soft,
        Err(_) => slipstream_proxy::sys::rlimit::current().map(|l| l.soft).unwrap_or(1024),
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
            c.control = Some(ControlSettings {
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
            log_drops: a.datapath_drops_log,
            wait: a.datapath_wait,
        });
        c.admin_addr = a.admin_addr;
        c.stats_addr = a.stats_addr;
        c.readiness_addr = a.readiness_addr;
        c.workers = a.workers;
        c.certs.validity = Duration::from_secs(a.cert_hours.max(1) * 3600);
        c
    }

    /// Every default of docs/protocols.md and docs/node-proxy.md, with `limits`.
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
            // Clamped to the connection window where it is used (hbone's server).
            min_connection_window: slipstream_hbone::MIN_CONNECTION_WINDOW,
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

    /// The node proxy's certificate authority: the control plane when one
    /// is configured (its channel given), else the local CA in `--ca-dir`.
    pub fn node_ca(&self, control: Option<&ControlChannel>) -> anyhow::Result<NodeCa> {
        NodeCa::new(self.control.as_ref(), control, &self.ca_dir)
    }

    /// Who this node proxy says it is in its xDS node: its node's name and
    /// the control plane's cluster id (else the cluster's name), the rest
    /// from the environment (`NodeInfo::from_env`).
    pub fn node_info(&self) -> NodeInfo {
        let cluster_id = self.control.as_ref().map_or(self.cluster.as_str(), |c| c.cluster_id.as_str());
        NodeInfo::from_env(&self.node, cluster_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
