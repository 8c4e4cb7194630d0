//! The request headers an HBONE client sends (docs/protocols.md section 2):
//! `baggage`, `forwarded` and `traceparent`.

use std::fmt;
use std::net::SocketAddr;

use http::HeaderValue;
use rand::RngCore;

use crate::authority::format_authority;

pub const BAGGAGE: &str = "baggage";
pub const FORWARDED: &str = "forwarded";
pub const TRACEPARENT: &str = "traceparent";

/// A W3C trace context (`traceparent`), version 00.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    pub sampled: bool,
}

impl TraceParent {
    /// A fresh, random context: each tunnelled connection starts its own trace.
    pub fn random() -> Self {
        let mut rng = rand::thread_rng();
        let mut trace_id = [0u8; 16];
        let mut parent_id = [0u8; 8];
        // All-zero ids are invalid; a random 128/64-bit value is never zero
        // in practice, but make it impossible rather than unlikely.
        while trace_id == [0; 16] {
            rng.fill_bytes(&mut trace_id);
        }
        while parent_id == [0; 8] {
            rng.fill_bytes(&mut parent_id);
        }
        Self { trace_id, parent_id, sampled: false }
    }

    pub fn parse(s: &str) -> Option<Self> {
        let mut parts = s.trim().split('-');
        let (version, trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || version != "00" {
            return None;
        }
        let trace_id: [u8; 16] = unhex(trace)?.try_into().ok()?;
        let parent_id: [u8; 8] = unhex(parent)?.try_into().ok()?;
        let flags: [u8; 1] = unhex(flags)?.try_into().ok()?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(Self { trace_id, parent_id, sampled: flags[0] & 1 == 1 })
    }

    pub fn header_value(&self) -> HeaderValue {
        HeaderValue::from_str(&self.to_string()).expect("hex is a valid header value")
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        for b in self.trace_id {
            write!(f, "{b:02x}")?;
        }
        f.write_str("-")?;
        for b in self.parent_id {
            write!(f, "{b:02x}")?;
        }
        write!(f, "-{:02x}", u8::from(self.sampled))
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || !s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

/// `forwarded: for="<client ip:port>"[;host=<service hostname>]` (RFC 7239).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarded {
    pub client: SocketAddr,
    /// The service host name, when the app addressed a service.
    pub host: Option<String>,
}

impl Forwarded {
    pub fn new(client: SocketAddr, host: Option<String>) -> Self {
        Self { client, host }
    }

    /// `None` if the host name cannot be carried in a header.
    pub fn header_value(&self) -> Option<HeaderValue> {
        // The node is always quoted: with a port (and IPv6 brackets) it is
        // not an RFC 7239 token.
        let mut value = format!("for=\"{}\"", format_authority(self.client));
        if let Some(host) = self.host.as_deref().filter(|h| !h.is_empty()) {
            value.push_str(";host=");
            if host.bytes().all(is_token_char) {
                value.push_str(host);
            } else {
                value.push('"');
                for c in host.chars() {
                    if c == '"' || c == '\\' {
                        value.push('\\');
                    }
                    value.push(c);
                }
                value.push('"');
            }
        }
        HeaderValue::from_str(&value).ok()
    }
}

fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Kubernetes workload kinds that name the `k8s.<kind>.name` baggage key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadKind {
    Deployment,
    Pod,
    Job,
    CronJob,
}

impl WorkloadKind {
    fn baggage_key(self) -> &'static str {
        match self {
            Self::Deployment => "k8s.deployment.name",
            Self::Pod => "k8s.pod.name",
            Self::Job => "k8s.job.name",
            Self::CronJob => "k8s.cronjob.name",
        }
    }
}

/// The source workload's metadata, sent as W3C `baggage` so the destination
/// can label its metrics with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Baggage {
    pub cluster_name: String,
    pub namespace: String,
    /// The workload's kind and name (`k8s.<kind>.name`).
    pub workload: Option<(WorkloadKind, String)>,
    pub service_name: String,
    pub service_version: String,
}

impl Baggage {
    /// `k=v` pairs joined by commas; empty values are left out. `None` when
    /// nothing is left.
    pub fn header_value(&self) -> Option<HeaderValue> {
        let mut pairs = Vec::with_capacity(5);
        let mut push = |key: &str, value: &str| {
            if !value.is_empty() {
                pairs.push(format!("{key}={}", percent_encode(value)));
            }
        };
        push("k8s.cluster.name", &self.cluster_name);
        push("k8s.namespace.name", &self.namespace);
        if let Some((kind, name)) = &self.workload {
            push(kind.baggage_key(), name);
        }
        push("service.name", &self.service_name);
        push("service.version", &self.service_version);
        if pairs.is_empty() {
            return None;
        }
        Some(HeaderValue::from_str(&pairs.join(",")).expect("percent-encoded baggage is ASCII"))
    }

    /// Reads the keys this type knows from a `baggage` header; others, and
    /// any `;properties`, are ignored.
    pub fn parse(header: &str) -> Self {
        let mut out = Self::default();
        for member in header.split(',') {
            let member = member.split(';').next().unwrap_or_default();
            let Some((key, value)) = member.split_once('=') else {
                continue;
            };
            let value = percent_decode(value.trim());
            match key.trim() {
                "k8s.cluster.name" => out.cluster_name = value,
                "k8s.namespace.name" => out.namespace = value,
                "k8s.deployment.name" => out.workload = Some((WorkloadKind::Deployment, value)),
                "k8s.pod.name" => out.workload = Some((WorkloadKind::Pod, value)),
                "k8s.job.name" => out.workload = Some((WorkloadKind::Job, value)),
                "k8s.cronjob.name" => out.workload = Some((WorkloadKind::CronJob, value)),
                "service.name" => out.service_name = value,
                "service.version" => out.service_version = value,
                _ => {}
            }
        }
        out
    }
}

/// W3C baggage values are percent-encoded outside `baggage-octet`.
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        let plain = matches!(b, 0x21 | 0x23..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E) && b != b'%';
        if plain {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(hi), Some(lo)) = (hex_val(bytes[i + 1]), hex_val(bytes[i + 2])) {
                out.push(hi << 4 | lo);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_val(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_format_and_parse() {
        let t = TraceParent::random();
        let s = t.to_string();
        assert_eq!(s.len(), 55);
        assert!(s.starts_with("00-") && s.ends_with("-00"));
        assert_eq!(TraceParent::parse(&s), Some(t));
        assert_ne!(TraceParent::random(), t, "fresh per connection");
        let fixed = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let p = TraceParent::parse(fixed).unwrap();
        assert!(p.sampled);
        assert_eq!(p.to_string(), fixed);
        for bad in [
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn forwarded() {
        let v4 = Forwarded::new("10.0.0.1:3456".parse().unwrap(), None);
        assert_eq!(v4.header_value().unwrap(), "for=\"10.0.0.1:3456\"");
        let v6 = Forwarded::new("[fd00::7]:80".parse().unwrap(), Some("reviews.default.svc.cluster.local".into()));
        assert_eq!(v6.header_value().unwrap(), "for=\"[fd00::7]:80\";host=reviews.default.svc.cluster.local");
        let odd = Forwarded::new("10.0.0.1:1".parse().unwrap(), Some("a b".into()));
        assert_eq!(odd.header_value().unwrap(), "for=\"10.0.0.1:1\";host=\"a b\"");
    }

    #[test]
    fn baggage_leaves_out_empty_values() {
        let b = Baggage {
            cluster_name: "Kubernetes".into(),
            namespace: "default".into(),
            workload: Some((WorkloadKind::Deployment, "reviews-v2".into())),
            service_name: "reviews".into(),
            service_version: String::new(),
        };
        let v = b.header_value().unwrap();
        assert_eq!(
            v,
            "k8s.cluster.name=Kubernetes,k8s.namespace.name=default,\
             k8s.deployment.name=reviews-v2,service.name=reviews"
        );
        assert_eq!(Baggage::parse(v.to_str().unwrap()), b);
        assert_eq!(Baggage::default().header_value(), None);

        let weird = Baggage { service_name: "a,b=c %d".into(), ..Default::default() };
        let v = weird.header_value().unwrap();
        assert_eq!(v, "service.name=a%2Cb=c%20%25d");
        assert_eq!(Baggage::parse(v.to_str().unwrap()), weird);
        // Malformed escapes pass through instead of panicking.
        assert_eq!(Baggage::parse("service.name=%a\u{e9}%").service_name, "%a\u{e9}%");
    }
}
