//! The label values of Istio's metrics that both proxies report with
//! (the node proxy's TCP metrics, the waypoint's request metrics), as
//! `prometheus-client` label value types.

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use std::fmt::Write as _;
use std::sync::Arc;

/// A label value: empty is `unknown`, as in Istio. Shared, so labelling a
/// connection clones pointers, not strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Lv(pub Arc<str>);

impl From<&str> for Lv {
    fn from(s: &str) -> Self {
        Lv(Arc::from(s))
    }
}

impl From<Arc<str>> for Lv {
    fn from(s: Arc<str>) -> Self {
        Lv(s)
    }
}

impl EncodeLabelValue for Lv {
    /// Escaped as the exposition format requires (`\\`, `\"`, `\n`):
    /// prometheus-client writes label values as they are, and one quote in
    /// a name must not break the whole scrape.
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        let v: &str = if self.0.is_empty() { "unknown" } else { &self.0 };
        if !v.contains(['\\', '"', '\n']) {
            return e.write_str(v);
        }
        for c in v.chars() {
            match c {
                '\\' => e.write_str("\\\\")?,
                '"' => e.write_str("\\\"")?,
                '\n' => e.write_str("\\n")?,
                c => e.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// `connection_security_policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Security {
    MutualTls,
    Unknown,
}

impl EncodeLabelValue for Security {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str(match self {
            Security::MutualTls => "mutual_tls",
            Security::Unknown => "unknown",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::EncodeLabelSet;

    #[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
    struct Labels {
        source_workload: Lv,
        destination_workload: Lv,
        connection_security_policy: Security,
    }

    /// The series of one label set, as a scrape shows it.
    fn render(l: Labels) -> String {
        let family = prometheus_client::metrics::family::Family::<Labels, prometheus_client::metrics::counter::Counter>::default();
        family.get_or_create(&l).inc();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("t", "t", family);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out.lines().find(|l| l.starts_with("t_total{")).unwrap().to_string()
    }

    #[test]
    fn empty_is_unknown_and_values_are_escaped() {
        let line = render(Labels {
            source_workload: "a\"b\\c\nd".into(),
            destination_workload: Lv::default(),
            connection_security_policy: Security::MutualTls,
        });
        assert_eq!(
            line,
            r#"t_total{source_workload="a\"b\\c\nd",destination_workload="unknown",connection_security_policy="mutual_tls"} 1"#
        );
        let line =
            render(Labels { source_workload: "x".into(), destination_workload: "y".into(), connection_security_policy: Security::Unknown });
        assert!(line.ends_with(r#"connection_security_policy="unknown"} 1"#), "{line}");
    }
}
