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
    #[arg(long, env = "SLIPSTREAM_CA_DIR")]
    pub ca_dir: PathBuf,
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
    /// Runtime threads. 1 runs everything on one thread (fewest context
    /// switches, at most one core); more spread connections over threads.
    #[arg(long, env = "SLIPSTREAM_NODE_WORKERS", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: u16,
}

#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub cluster: String,
    pub node: String,
    pub config_dir: PathBuf,
    pub ca_dir: PathBuf,
    pub json_access_log: bool,
    pub admin_addr: SocketAddr,
    pub stats_addr: SocketAddr,
    pub readiness_addr: SocketAddr,
    pub cert_validity: Duration,
    /// Upstream connect timeout, inbound (PROTOCOLS.md: 503 after 10 s).
    pub connect_timeout: Duration,
    /// How often the configuration files are checked for changes.
    pub poll_interval: Duration,
    /// How long open connections may finish after a drain starts.
    pub drain_period: Duration,
}

impl Config {
    pub fn from_args(cluster: &str, a: NodeArgs) -> Config {
        Config {
            cluster: cluster.to_string(),
            node: a.node,
            config_dir: a.config_dir,
            ca_dir: a.ca_dir,
            json_access_log: a.log_format == "json",
            admin_addr: a.admin_addr,
            stats_addr: a.stats_addr,
            readiness_addr: a.readiness_addr,
            cert_validity: Duration::from_secs(a.cert_hours.max(1) * 3600),
            connect_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_millis(100),
            drain_period: Duration::from_secs(5),
        }
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
