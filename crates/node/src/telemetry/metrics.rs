//! Istio's L4 metrics (docs/protocols.md section 6) and the node proxy's
//! own counters, through `prometheus-client`: label sets are typed structs,
//! families are looked up under a shared read lock (a write lock only the
//! first time a label set is seen), and counting is an atomic add.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use slipstream_hbone::{ResponseFlag, ServerStats};
use slipstream_proxy::metrics::{Lv, Security};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reporter {
    Source,
    Destination,
}

impl EncodeLabelValue for Reporter {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str(match self {
            Reporter::Source => "source",
            Reporter::Destination => "destination",
        })
    }
}

/// `response_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flag(pub ResponseFlag);

impl EncodeLabelValue for Flag {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str(self.0.as_str())
    }
}

/// `request_protocol`: always `tcp` at L4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tcp;

impl EncodeLabelValue for Tcp {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str("tcp")
    }
}

/// The labels of Istio's TCP metrics, in Istio's order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TcpLabels {
    pub reporter: Reporter,
    pub source_workload: Lv,
    pub source_workload_namespace: Lv,
    pub source_principal: Lv,
    pub source_app: Lv,
    pub source_version: Lv,
    pub source_canonical_service: Lv,
    pub source_cluster: Lv,
    pub destination_service: Lv,
    pub destination_service_namespace: Lv,
    pub destination_service_name: Lv,
    pub destination_workload: Lv,
    pub destination_workload_namespace: Lv,
    pub destination_principal: Lv,
    pub destination_app: Lv,
    pub destination_version: Lv,
    pub destination_canonical_service: Lv,
    pub destination_cluster: Lv,
    pub request_protocol: Tcp,
    pub response_flags: Flag,
    pub connection_security_policy: Security,
}

/// Connections refused before a workload could be named, by flag and
/// reason (both from fixed sets).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RejectedLabels {
    pub response_flags: Flag,
    pub reason: &'static str,
}

/// Connections a policy refused, by the policy and rule that decided.
/// Bounded by the policies of the mesh (label values come from them, not
/// from connections).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DenialLabels {
    pub reporter: Reporter,
    /// `network_policy` or `authorization`.
    pub layer: &'static str,
    pub policy_kind: &'static str,
    pub policy_namespace: String,
    pub policy_name: String,
    /// `spec.rules[0]`, `spec.ingress[1]`; empty when no single rule
    /// decided (allow policies applied and none matched).
    pub policy_rule: String,
}

/// The node proxy's metrics, registered once.
pub struct Metrics {
    registry: Registry,
    opened: Family<TcpLabels, Counter>,
    closed: Family<TcpLabels, Counter>,
    received: Family<TcpLabels, Counter>,
    sent: Family<TcpLabels, Counter>,
    rejected: Family<RejectedLabels, Counter>,
    denials: Family<DenialLabels, Counter>,
    /// Time from capture to the first byte being able to flow (outbound:
    /// plan, connect, HBONE handshake and CONNECT answer), by how it ended.
    setup_seconds: Family<SetupLabels, Histogram>,
    /// The HBONE servers' own counters, shared by every pod's server.
    pub hbone: Arc<ServerStats>,
    /// Connections closed since start, all labels together (for memtrim).
    closed_total: AtomicU64,
    /// The eBPF datapath's maps, once the proxy has opened them: its drop
    /// counters are read at each scrape.
    pub datapath: Arc<std::sync::OnceLock<Arc<slipstream_ebpf::NodeMaps>>>,
    /// The node's buffer budget, once the proxy made it: read at each
    /// scrape.
    pub buffers: Arc<std::sync::OnceLock<Arc<slipstream_proxy::limits::Buffers>>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct SetupLabels {
    pub reporter: Reporter,
    pub response_flags: Flag,
}

impl Default for Metrics {
    fn default() -> Self {
        let hbone = Arc::new(ServerStats::default());
        let mut registry = Registry::default();
        let (opened, closed, received, sent) = (Family::default(), Family::default(), Family::default(), Family::default());
        let rejected = Family::default();
        let denials = Family::default();
        let setup_seconds =
            Family::<SetupLabels, Histogram>::new_with_constructor(|| Histogram::new(exponential_buckets(0.0001, 2.0, 16)) as Histogram);
        // prometheus-client adds `_total` to counters.
        registry.register("istio_tcp_connections_opened", "TCP connections opened", opened.clone());
        registry.register("istio_tcp_connections_closed", "TCP connections closed", closed.clone());
        registry.register("istio_tcp_received_bytes", "Bytes received from the client (client to server)", received.clone());
        registry.register("istio_tcp_sent_bytes", "Bytes sent to the client (server to client)", sent.clone());
        registry.register("slipstream_rejected_connections", "Connections refused before a workload could be named", rejected.clone());
        registry.register(
            "slipstream_policy_denials",
            "Connections a policy refused, by the deciding policy and rule (with response_flags=DENY in istio_tcp_connections_closed_total)",
            denials.clone(),
        );
        registry.register(
            "slipstream_connection_setup_seconds",
            "Time to set a connection up, until bytes can flow or it is refused",
            setup_seconds.clone(),
        );
        registry.register_collector(Box::new(HboneCollector(hbone.clone())));
        let datapath = Arc::new(std::sync::OnceLock::new());
        registry.register_collector(Box::new(DatapathCollector(datapath.clone())));
        let buffers = Arc::new(std::sync::OnceLock::new());
        registry.register_collector(Box::new(BuffersCollector(buffers.clone())));
        Metrics {
            buffers,
            registry,
            opened,
            closed,
            received,
            sent,
            rejected,
            denials,
            setup_seconds,
            hbone,
            closed_total: AtomicU64::new(0),
            datapath,
        }
    }
}

impl Metrics {
    pub fn opened(&self, l: &TcpLabels) {
        self.opened.get_or_create(l).inc();
    }

    /// `received` is client to server, `sent` server to client.
    pub fn closed(&self, l: &TcpLabels, received: u64, sent: u64) {
        self.closed_total.fetch_add(1, Ordering::Relaxed);
        self.closed.get_or_create(l).inc();
        // A series of 0 still appears, as Istio's does.
        self.received.get_or_create(l).inc_by(received);
        self.sent.get_or_create(l).inc_by(sent);
    }

    pub fn setup(&self, reporter: Reporter, flag: ResponseFlag, seconds: f64) {
        self.setup_seconds.get_or_create(&SetupLabels { reporter, response_flags: Flag(flag) }).observe(seconds);
    }

    /// Connections closed since start.
    pub fn closed_total(&self) -> u64 {
        self.closed_total.load(Ordering::Relaxed)
    }

    /// A connection a policy refused.
    pub fn denied(&self, reporter: Reporter, d: &slipstream_proxy::denial::Denial) {
        let (kind, namespace, name, rule) = match &d.by {
            Some(p) => (p.kind.as_str(), p.namespace.clone(), p.name.clone(), p.rule.clone().unwrap_or_default()),
            None => ("", String::new(), String::new(), String::new()),
        };
        let l =
            DenialLabels { reporter, layer: d.layer, policy_kind: kind, policy_namespace: namespace, policy_name: name, policy_rule: rule };
        self.denials.get_or_create(&l).inc();
    }

    /// A refusal with its reason, a label value from a fixed set.
    pub fn rejected_because(&self, flag: ResponseFlag, reason: &'static str) {
        self.rejected.get_or_create(&RejectedLabels { response_flags: Flag(flag), reason }).inc();
    }

    /// One series' counters, for tests: (opened, closed, received, sent).
    pub fn tcp(&self, l: &TcpLabels) -> (u64, u64, u64, u64) {
        (
            self.opened.get_or_create(l).get(),
            self.closed.get_or_create(l).get(),
            self.received.get_or_create(l).get(),
            self.sent.get_or_create(l).get(),
        )
    }

    /// The OpenMetrics text of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// A counter family: name, help, label name ("" for none) and the values
/// by label value.
type Family7 = (&'static str, &'static str, &'static str, Vec<(&'static str, u64)>);

/// Exposes the HBONE servers' atomic counters at scrape time.
#[derive(Debug)]
struct HboneCollector(Arc<ServerStats>);

impl Collector for HboneCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.0.snapshot();
        let families: [Family7; 7] = [
            ("slipstream_hbone_inbound_connections", "HBONE connections accepted on :15008", "", vec![("", s.connections_accepted)]),
            (
                "slipstream_hbone_inbound_handshake_failures",
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
                "slipstream_hbone_inbound_connection_closes",
                "HBONE connections the server closed",
                "reason",
                vec![
                    ("keepalive_timeout", s.keepalive_timeouts),
                    ("protocol_error", s.protocol_errors),
                    ("drain_deadline", s.drain_forced_closes),
                ],
            ),
            ("slipstream_hbone_inbound_streams", "CONNECT streams received", "", vec![("", s.streams)]),
            (
                "slipstream_hbone_inbound_responses",
                "CONNECT answers by status",
                "code",
                vec![("200", s.status_200), ("400", s.status_400), ("401", s.status_401), ("503", s.status_503), ("other", s.status_other)],
            ),
            ("slipstream_hbone_inbound_tunnels_failed", "Tunnels answered 200 that ended with an error", "", vec![("", s.tunnels_failed)]),
            (
                "slipstream_hbone_inbound_bytes",
                "Bytes carried by inbound tunnels",
                "direction",
                vec![("from_peer", s.bytes_from_peer), ("to_peer", s.bytes_to_peer)],
            ),
        ];
        for (name, help, label, values) in families {
            let kind = ConstCounter::new(0u64).metric_type();
            let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
            if label.is_empty() {
                ConstCounter::new(values.first().map_or(0, |v| v.1)).encode(metric)?;
                continue;
            }
            for (value, n) in values {
                let labels = [(label, value)];
                ConstCounter::new(n).encode(metric.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// `slipstream_datapath_drops_total{reason}`: connections this node's
/// kernel datapath refused, by reason (absent without the eBPF datapath).
#[derive(Debug)]
struct DatapathCollector(Arc<std::sync::OnceLock<Arc<slipstream_ebpf::NodeMaps>>>);

impl Collector for DatapathCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(maps) = self.0.get() else { return Ok(()) };
        let kind = ConstCounter::new(0u64).metric_type();
        let mut metric = encoder.encode_descriptor(
            "slipstream_datapath_drops",
            "Connections the kernel datapath dropped on this node, by reason (POLICY_DENIED at the source's connect(), NO_PROXY at the destination while its node proxy is away)",
            None,
            kind,
        )?;
        for (reason, n) in maps.drops() {
            let labels = [("reason", reason.as_str())];
            ConstCounter::new(n).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// `slipstream_buffer_budget_bytes` and `slipstream_buffered_bytes`: the
/// node's buffer budget and what its connections' bulk buffers hold of it.
#[derive(Debug)]
struct BuffersCollector(Arc<std::sync::OnceLock<Arc<slipstream_proxy::limits::Buffers>>>);

impl Collector for BuffersCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::gauge::ConstGauge;
        let Some(b) = self.0.get() else { return Ok(()) };
        for (name, help, v) in [
            ("slipstream_buffer_budget_bytes", "Bytes the connections' bulk buffers may hold, all pods together", b.budget()),
            ("slipstream_buffered_bytes", "Bytes the connections' bulk buffers hold now, all pods together", b.used()),
        ] {
            let g = ConstGauge::new(v as i64);
            let metric = encoder.encode_descriptor(name, help, None, g.metric_type())?;
            g.encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> TcpLabels {
        TcpLabels {
            reporter: Reporter::Source,
            source_workload: "client".into(),
            source_workload_namespace: "default".into(),
            source_principal: "spiffe://cluster.local/ns/default/sa/client".into(),
            source_app: Lv::default(),
            source_version: Lv::default(),
            source_canonical_service: Lv::default(),
            source_cluster: Lv::default(),
            destination_service: "echo.default.svc.cluster.local".into(),
            destination_service_namespace: "default".into(),
            destination_service_name: "echo".into(),
            destination_workload: Lv::default(),
            destination_workload_namespace: Lv::default(),
            destination_principal: Lv::default(),
            destination_app: Lv::default(),
            destination_version: Lv::default(),
            destination_canonical_service: Lv::default(),
            destination_cluster: Lv::default(),
            request_protocol: Tcp,
            response_flags: Flag(ResponseFlag::None),
            connection_security_policy: Security::MutualTls,
        }
    }

    #[test]
    fn counts_exactly_and_renders_with_istio_names() {
        let m = Metrics::default();
        let l = labels();
        m.opened(&l);
        m.closed(&l, 10, 20);
        m.opened(&l);
        assert_eq!(m.tcp(&l), (2, 1, 10, 20));
        assert_eq!(m.closed_total(), 1);
        let text = m.render();
        let opened = text.lines().find(|l| l.starts_with("istio_tcp_connections_opened_total{")).expect(&text);
        assert!(opened.starts_with("istio_tcp_connections_opened_total{reporter=\"source\",source_workload=\"client\""), "{opened}");
        assert!(opened.contains("destination_workload=\"unknown\""), "empty is unknown: {opened}");
        assert!(opened.ends_with("response_flags=\"-\",connection_security_policy=\"mutual_tls\"} 2"), "{opened}");
        assert!(text.contains("request_protocol=\"tcp\""));
        let sent = text.lines().find(|l| l.starts_with("istio_tcp_sent_bytes_total{")).unwrap();
        assert!(sent.ends_with("} 20"), "{sent}");
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::default();
        let mut l = labels();
        l.source_workload = "a\"b\\c\nd".into();
        m.opened(&l);
        let text = m.render();
        assert!(text.contains(r#"source_workload="a\"b\\c\nd""#), "{text}");
    }

    #[test]
    fn refusals_by_reason_hbone_counters_and_histograms() {
        let m = Metrics::default();
        m.rejected_because(ResponseFlag::TlsFailure, "not_tls");
        m.rejected_because(ResponseFlag::TlsFailure, "not_tls");
        m.rejected_because(ResponseFlag::ProtocolError, "unknown");
        m.setup(Reporter::Source, ResponseFlag::None, 0.002);
        let text = m.render();
        assert!(text.contains("slipstream_rejected_connections_total{response_flags=\"TLS_FAILURE\",reason=\"not_tls\"} 2"), "{text}");
        assert!(text.contains("slipstream_rejected_connections_total{response_flags=\"PROTOCOL_ERROR\",reason=\"unknown\"} 1"), "{text}");
        assert!(text.contains("slipstream_hbone_inbound_connections_total 0"), "{text}");
        assert!(text.contains("slipstream_hbone_inbound_responses_total{code=\"400\"} 0"), "{text}");
        assert!(text.contains("slipstream_hbone_inbound_connection_closes_total{reason=\"protocol_error\"} 0"), "{text}");
        assert!(text.contains("slipstream_connection_setup_seconds_count{reporter=\"source\",response_flags=\"-\"} 1"), "{text}");
    }

    /// The names and labels of every metric and the keys of the access
    /// log, against `golden/telemetry.txt` (docs/protocols.md section 6).
    #[test]
    fn metric_names_labels_and_access_log_keys_are_the_golden_ones() {
        let m = Metrics::default();
        m.opened(&labels());
        m.closed(&labels(), 1, 2);
        m.rejected_because(ResponseFlag::TlsFailure, "not_tls");
        m.setup(Reporter::Source, ResponseFlag::None, 0.002);
        let by = slipstream_core::policy::PolicyRule {
            kind: slipstream_core::policy::PolicyKind::AuthorizationPolicy,
            namespace: "ns".into(),
            name: "deny".into(),
            rule: Some("rules[0]".into()),
        };
        m.denied(Reporter::Destination, &slipstream_proxy::denial::Denial { text: "denied".into(), layer: "authorization", by: Some(by) });
        let _ = m.buffers.set(slipstream_proxy::limits::Buffers::new(1 << 20));
        let mut got = slipstream_proxy::metrics::shapes(&m.render());
        let entry = crate::telemetry::accesslog::AccessLogEntry {
            src_addr: "a".into(),
            src_workload: "a".into(),
            src_namespace: "a".into(),
            src_identity: "a".into(),
            dst_addr: "a".into(),
            dst_hbone_addr: "a".into(),
            dst_service: "a".into(),
            dst_workload: "a".into(),
            dst_namespace: "a".into(),
            dst_identity: "a".into(),
            direction: "outbound",
            bytes_sent: 1,
            bytes_recv: 1,
            duration: 1,
            error: Some("e".into()),
            flag: Some("DENY"),
        };
        let json: serde_json::Value = serde_json::from_str(&entry.render(true)).unwrap();
        got.extend(json.as_object().unwrap().keys().map(|k| format!("accesslog json {k}")));
        for word in entry.render(false).split(' ').skip(2) {
            got.insert(format!("accesslog text {}", word.split('=').next().unwrap()));
        }
        let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/telemetry.txt");
        slipstream_proxy::metrics::compare_golden(&golden, &got).unwrap_or_else(|e| panic!("{e}"));
    }
}
