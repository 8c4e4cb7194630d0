//! The configuration both proxies share: their bounds ([`Limits`],
//! derived from the open-file limit, with the flags that override them,
//! [`LimitArgs`]) and the parsers of size and duration flags. The node
//! proxy's `Config` holds a [`Limits`] and serves it at `/config_dump`;
//! the waypoint derives its per-peer bounds with the same function.

use serde::Serialize;
use std::time::Duration;

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
    #[arg(long, env = "SLIPSTREAM_NODE_ADMIN_HEADER_TIMEOUT", value_parser = slipstream_core::duration::parse_flag)]
    pub admin_header_timeout: Option<Duration>,
    /// How long any connection to an admin port may last.
    #[arg(long, env = "SLIPSTREAM_NODE_ADMIN_CONNECTION_DEADLINE", value_parser = slipstream_core::duration::parse_flag)]
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

/// A duration served as seconds (`/config_dump`).
pub fn as_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
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
}
