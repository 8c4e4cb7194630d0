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

/// The shape of an OpenMetrics text, without its values: `type <name>
/// <kind>` for each family and `series <name> {<label names>}` for each
/// distinct series shape, sorted. What the golden tests of both proxies
/// compare (docs/protocols.md section 6): names and labels are a contract
/// with dashboards and alerts; values are not.
pub fn shapes(openmetrics: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for line in openmetrics.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            out.insert(format!("type {t}"));
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let (name, rest) = line.split_at(name_end);
        let mut labels = Vec::new();
        if let Some(mut body) = rest.strip_prefix('{') {
            // `key="value",...}`: values may hold escaped quotes.
            while let Some(eq) = body.find("=\"") {
                labels.push(body[..eq].trim_start_matches(',').to_string());
                let mut chars = body[eq + 2..].char_indices();
                let mut close = body.len() - eq - 2;
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => {
                            close = i;
                            break;
                        }
                        _ => {}
                    }
                }
                body = body.get(eq + 2 + close + 1..).unwrap_or("");
                if body.starts_with('}') {
                    break;
                }
            }
        }
        out.insert(format!("series {name} {{{}}}", labels.join(",")));
    }
    out
}

/// Compares `got` (one line each) with the golden file at `path`: equal,
/// or an error that lists what appeared and what went. With
/// `SLIPSTREAM_BLESS` set, rewrites the file instead (a change of name
/// or label is then in the diff a reviewer reads).
pub fn compare_golden(path: &std::path::Path, got: &std::collections::BTreeSet<String>) -> Result<(), String> {
    let text: String = got.iter().map(|l| format!("{l}\n")).collect();
    if std::env::var_os("SLIPSTREAM_BLESS").is_some() {
        return std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()));
    }
    let want = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let want: std::collections::BTreeSet<String> = want.lines().map(String::from).collect();
    if &want == got {
        return Ok(());
    }
    let added: Vec<_> = got.difference(&want).collect();
    let removed: Vec<_> = want.difference(got).collect();
    Err(format!(
        "metric names, labels or log keys changed (a contract with dashboards, alerts and log pipelines, docs/protocols.md \
         section 6): new {added:?}, gone {removed:?}; if meant, rewrite {} with SLIPSTREAM_BLESS=1 and say so in the docs",
        path.display()
    ))
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

    #[test]
    fn shapes_keep_names_and_label_names_only() {
        let text =
            "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\",y=\"q\\\"uo,te\"} 3\na_total{x=\"2\",y=\"\"} 4\nb 1\n# EOF\n";
        let got: Vec<String> = shapes(text).into_iter().collect();
        assert_eq!(got, vec!["series a_total {x,y}", "series b {}", "type a_total counter"]);
    }
}
