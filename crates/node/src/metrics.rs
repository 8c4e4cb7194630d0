//! Istio's L4 metrics (shared/PROTOCOLS.md section 6), typed: one label set
//! struct, counters keyed by it, Prometheus text on /metrics.

use serde::Serialize;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use slipstream_hbone::{ServerStats, StatsSnapshot};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reporter {
    Source,
    Destination,
}

pub use slipstream_hbone::ResponseFlag;

/// One side of a connection as the labels see it. Unknown values are
/// `unknown`, as in Istio.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize)]
pub struct Peer {
    pub workload: String,
    pub namespace: String,
    pub principal: String,
    pub app: String,
    pub version: String,
    pub cluster: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TcpLabels {
    pub reporter: Reporter,
    pub source: Peer,
    pub destination: Peer,
    /// Service hostname, name and namespace when a service was addressed.
    pub destination_service: String,
    pub destination_service_name: String,
    pub destination_service_namespace: String,
    pub response_flags: ResponseFlag,
    pub mutual_tls: bool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TcpCounters {
    pub opened: u64,
    pub closed: u64,
    /// Client to server.
    pub received_bytes: u64,
    /// Server to client.
    pub sent_bytes: u64,
}

#[derive(Default)]
pub struct Metrics {
    tcp: Mutex<HashMap<TcpLabels, TcpCounters>>,
    /// Connections refused before any workload could be named (TLS failures
    /// on :15008, garbage), by flag and reason (both from fixed sets).
    rejected: Mutex<HashMap<(&'static str, &'static str), u64>>,
    /// The HBONE servers' own counters, shared by every pod's server.
    pub hbone: Arc<ServerStats>,
    /// Connections closed since start, all labels together (for memtrim).
    closed_total: AtomicU64,
}

/// A counter family: name, help text, and which counter it shows.
type CounterFamily = (&'static str, &'static str, fn(&TcpCounters) -> u64);

fn or_unknown(s: &str) -> &str {
    if s.is_empty() {
        "unknown"
    } else {
        s
    }
}

impl Metrics {
    pub fn opened(&self, l: &TcpLabels) {
        let mut m = self.tcp.lock().expect("metrics lock");
        // Look up before inserting: cloning the labels (a dozen strings)
        // for every connection is measurable at thousands per second.
        match m.get_mut(l) {
            Some(c) => c.opened += 1,
            None => m.entry(l.clone()).or_default().opened += 1,
        }
    }

    /// Connections closed since start.
    pub fn closed_total(&self) -> u64 {
        self.closed_total.load(Ordering::Relaxed)
    }

    pub fn closed(&self, l: &TcpLabels, received: u64, sent: u64) {
        self.closed_total.fetch_add(1, Ordering::Relaxed);
        let mut m = self.tcp.lock().expect("metrics lock");
        let c = match m.get_mut(l) {
            Some(c) => c,
            None => m.entry(l.clone()).or_default(),
        };
        c.closed += 1;
        c.received_bytes += received;
        c.sent_bytes += sent;
    }

    pub fn rejected(&self, flag: ResponseFlag) {
        self.rejected_because(flag, "unknown");
    }

    /// A refusal with its reason, a label value from a fixed set.
    pub fn rejected_because(&self, flag: ResponseFlag, reason: &'static str) {
        *self.rejected.lock().expect("metrics lock").entry((flag.as_str(), reason)).or_default() += 1;
    }

    /// Counters for tests and the admin dump.
    pub fn snapshot(&self) -> Vec<(TcpLabels, TcpCounters)> {
        self.tcp.lock().expect("metrics lock").iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    pub fn render(&self) -> String {
        let tcp = self.snapshot();
        let mut out = String::new();
        let families: [CounterFamily; 4] = [
            ("istio_tcp_connections_opened_total", "TCP connections opened", |c| c.opened),
            ("istio_tcp_connections_closed_total", "TCP connections closed", |c| c.closed),
            ("istio_tcp_received_bytes_total", "Bytes received from the client (client to server)", |c| c.received_bytes),
            ("istio_tcp_sent_bytes_total", "Bytes sent to the client (server to client)", |c| c.sent_bytes),
        ];
        for (name, help, get) in families {
            let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter");
            for (l, c) in &tcp {
                let _ = writeln!(out, "{name}{{{}}} {}", labels(l), get(c));
            }
        }
        let _ = writeln!(out, "# HELP slipstream_rejected_connections_total Connections refused before a workload could be named.\n# TYPE slipstream_rejected_connections_total counter");
        for ((flag, reason), n) in self.rejected.lock().expect("metrics lock").iter() {
            let _ = writeln!(out, "slipstream_rejected_connections_total{{response_flags=\"{flag}\",reason=\"{reason}\"}} {n}");
        }
        render_hbone(&mut out, &self.hbone.snapshot());
        out
    }
}

/// A counter family: name, help, label name ("" for none) and the values
/// by label value.
type Family = (&'static str, &'static str, &'static str, Vec<(&'static str, u64)>);

/// The HBONE servers' counters (all pods of the node together).
fn render_hbone(out: &mut String, s: &StatsSnapshot) {
    let families: [Family; 7] = [
        ("slipstream_hbone_inbound_connections_total", "HBONE connections accepted on :15008", "", vec![("", s.connections_accepted)]),
        (
            "slipstream_hbone_inbound_handshake_failures_total",
            "HBONE connections that ended before a stream, by stage",
            "stage",
            vec![
                ("refused", s.refused_no_workload + s.refused_cert_unavailable),
                ("limit", s.refused_limit),
                ("tls", s.tls_failures),
                ("http2", s.h2_failures),
            ],
        ),
        (
            "slipstream_hbone_inbound_connection_closes_total",
            "HBONE connections the server closed",
            "reason",
            vec![
                ("keepalive_timeout", s.keepalive_timeouts),
                ("protocol_error", s.protocol_errors),
                ("drain_deadline", s.drain_forced_closes),
            ],
        ),
        ("slipstream_hbone_inbound_streams_total", "CONNECT streams received", "", vec![("", s.streams)]),
        (
            "slipstream_hbone_inbound_responses_total",
            "CONNECT answers by status",
            "code",
            vec![("200", s.status_200), ("400", s.status_400), ("401", s.status_401), ("503", s.status_503), ("other", s.status_other)],
        ),
        (
            "slipstream_hbone_inbound_tunnels_failed_total",
            "Tunnels answered 200 that ended with an error",
            "",
            vec![("", s.tunnels_failed)],
        ),
        (
            "slipstream_hbone_inbound_bytes_total",
            "Bytes carried by inbound tunnels",
            "direction",
            vec![("from_peer", s.bytes_from_peer), ("to_peer", s.bytes_to_peer)],
        ),
    ];
    for (name, help, label, values) in families {
        let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} counter");
        for (value, n) in values {
            if label.is_empty() {
                let _ = writeln!(out, "{name} {n}");
            } else {
                let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {n}");
            }
        }
    }
}

fn esc(s: &str) -> String {
    or_unknown(s).replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn labels(l: &TcpLabels) -> String {
    let mut v: Vec<(&str, String)> = vec![(
        "reporter",
        match l.reporter {
            Reporter::Source => "source".into(),
            Reporter::Destination => "destination".into(),
        },
    )];
    for (prefix, p) in [("source", &l.source), ("destination", &l.destination)] {
        v.push((if prefix == "source" { "source_workload" } else { "destination_workload" }, esc(&p.workload)));
        v.push((if prefix == "source" { "source_workload_namespace" } else { "destination_workload_namespace" }, esc(&p.namespace)));
        v.push((if prefix == "source" { "source_principal" } else { "destination_principal" }, esc(&p.principal)));
        v.push((if prefix == "source" { "source_app" } else { "destination_app" }, esc(&p.app)));
        v.push((if prefix == "source" { "source_version" } else { "destination_version" }, esc(&p.version)));
        v.push((if prefix == "source" { "source_canonical_service" } else { "destination_canonical_service" }, esc(&p.app)));
        v.push((if prefix == "source" { "source_cluster" } else { "destination_cluster" }, esc(&p.cluster)));
    }
    v.push(("destination_service", esc(&l.destination_service)));
    v.push(("destination_service_namespace", esc(&l.destination_service_namespace)));
    v.push(("destination_service_name", esc(&l.destination_service_name)));
    v.push(("request_protocol", "tcp".into()));
    v.push(("response_flags", l.response_flags.as_str().into()));
    v.push(("connection_security_policy", if l.mutual_tls { "mutual_tls".into() } else { "unknown".into() }));
    v.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_renders_with_istio_names() {
        let m = Metrics::default();
        let l = TcpLabels {
            reporter: Reporter::Source,
            source: Peer {
                workload: "client".into(),
                namespace: "default".into(),
                principal: "spiffe://cluster.local/ns/default/sa/client".into(),
                ..Default::default()
            },
            destination: Peer::default(),
            destination_service: "echo.default.svc.cluster.local".into(),
            destination_service_name: "echo".into(),
            destination_service_namespace: "default".into(),
            response_flags: ResponseFlag::None,
            mutual_tls: true,
        };
        m.opened(&l);
        m.closed(&l, 10, 20);
        m.opened(&l);
        let text = m.render();
        assert!(text.contains("istio_tcp_connections_opened_total{reporter=\"source\",source_workload=\"client\""), "{text}");
        assert!(text.contains("destination_workload=\"unknown\""));
        assert!(text.contains("connection_security_policy=\"mutual_tls\"} 2"));
        let snap = m.snapshot();
        assert_eq!(snap[0].1, TcpCounters { opened: 2, closed: 1, received_bytes: 10, sent_bytes: 20 });
    }

    #[test]
    fn refusals_by_reason_and_hbone_server_counters() {
        let m = Metrics::default();
        m.rejected_because(ResponseFlag::TlsFailure, "not_tls");
        m.rejected_because(ResponseFlag::TlsFailure, "not_tls");
        m.rejected(ResponseFlag::ProtocolError);
        let text = m.render();
        assert!(text.contains("slipstream_rejected_connections_total{response_flags=\"TLS_FAILURE\",reason=\"not_tls\"} 2"), "{text}");
        assert!(text.contains("slipstream_rejected_connections_total{response_flags=\"PROTOCOL_ERROR\",reason=\"unknown\"} 1"), "{text}");
        assert!(text.contains("slipstream_hbone_inbound_connections_total 0"), "{text}");
        assert!(text.contains("slipstream_hbone_inbound_responses_total{code=\"400\"} 0"), "{text}");
        assert!(text.contains("slipstream_hbone_inbound_connection_closes_total{reason=\"protocol_error\"} 0"), "{text}");
    }
}
