//! One line per connection when it closes (docs/protocols.md section 6),
//! plain `key=value` or JSON.

use serde::Serialize;

#[derive(Debug, Clone, Serialize, Default)]
pub struct AccessLogEntry {
    #[serde(rename = "src.addr")]
    pub src_addr: String,
    #[serde(rename = "src.workload")]
    pub src_workload: String,
    #[serde(rename = "src.namespace")]
    pub src_namespace: String,
    #[serde(rename = "src.identity")]
    pub src_identity: String,
    #[serde(rename = "dst.addr")]
    pub dst_addr: String,
    #[serde(rename = "dst.hbone_addr")]
    pub dst_hbone_addr: String,
    #[serde(rename = "dst.service")]
    pub dst_service: String,
    #[serde(rename = "dst.workload")]
    pub dst_workload: String,
    #[serde(rename = "dst.namespace")]
    pub dst_namespace: String,
    #[serde(rename = "dst.identity")]
    pub dst_identity: String,
    pub direction: &'static str,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    /// Milliseconds.
    pub duration: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flag: Option<&'static str>,
}

impl AccessLogEntry {
    pub fn render(&self, json: bool) -> String {
        if json {
            let mut v = serde_json::to_value(self).unwrap_or_default();
            if let Some(m) = v.as_object_mut() {
                m.insert("message".into(), "connection complete".into());
                m.retain(|_, v| !v.as_str().is_some_and(str::is_empty));
            }
            return v.to_string();
        }
        let mut s = String::from("connection complete");
        let fields = [
            ("src.addr", &self.src_addr),
            ("src.workload", &self.src_workload),
            ("src.namespace", &self.src_namespace),
            ("src.identity", &self.src_identity),
            ("dst.addr", &self.dst_addr),
            ("dst.hbone_addr", &self.dst_hbone_addr),
            ("dst.service", &self.dst_service),
            ("dst.workload", &self.dst_workload),
            ("dst.namespace", &self.dst_namespace),
            ("dst.identity", &self.dst_identity),
        ];
        for (k, v) in fields {
            if !v.is_empty() {
                s.push_str(&format!(" {k}={}", quote(v)));
            }
        }
        s.push_str(&format!(
            " direction={} bytes_sent={} bytes_recv={} duration=\"{}ms\"",
            self.direction, self.bytes_sent, self.bytes_recv, self.duration
        ));
        if let Some(e) = &self.error {
            s.push_str(&format!(" error={}", quote(e)));
        }
        if let Some(f) = self.flag {
            s.push_str(&format!(" flag={f}"));
        }
        s
    }
}

fn quote(v: &str) -> String {
    if v.chars().any(|c| c.is_whitespace() || c == '"') {
        format!("{v:?}")
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_json() {
        let e = AccessLogEntry {
            src_addr: "10.244.1.2:40000".into(),
            src_identity: "spiffe://cluster.local/ns/default/sa/client".into(),
            dst_addr: "10.244.2.2:8080".into(),
            direction: "outbound",
            bytes_sent: 5,
            bytes_recv: 7,
            duration: 3,
            error: Some("connection refused".into()),
            flag: Some("CONNECT"),
            ..Default::default()
        };
        let p = e.render(false);
        assert_eq!(p, "connection complete src.addr=10.244.1.2:40000 src.identity=spiffe://cluster.local/ns/default/sa/client dst.addr=10.244.2.2:8080 direction=outbound bytes_sent=5 bytes_recv=7 duration=\"3ms\" error=\"connection refused\" flag=CONNECT");
        let j: serde_json::Value = serde_json::from_str(&e.render(true)).unwrap();
        assert_eq!(j["src.identity"], "spiffe://cluster.local/ns/default/sa/client");
        assert_eq!(j["bytes_recv"], 7);
        assert!(j.get("dst.workload").is_none(), "empty fields are left out");
    }
}
