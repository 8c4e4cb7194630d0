//! The node proxies' access-log lines (`connection complete ...`, plain
//! `key=value` or JSON; docs/protocols.md section 6) read back as flows, the
//! records `slipstream observe` prints. Pure, for tests.

use slipstream_testbed::agent::flows::Endpoint;
use slipstream_testbed::ipc::Flow;
use std::collections::BTreeMap;

/// The fields of one line: `key=value`, a value quoted as Rust's `{:?}`
/// quotes it when it holds spaces or quotes. `None` for other lines.
pub fn fields(line: &str) -> Option<BTreeMap<String, String>> {
    let line = line.trim();
    if line.starts_with('{') {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        if v["message"] != "connection complete" {
            return None;
        }
        let m = v.as_object()?;
        return Some(m.iter().map(|(k, v)| (k.clone(), v.as_str().map(String::from).unwrap_or_else(|| v.to_string()))).collect());
    }
    let rest = line.strip_prefix("connection complete")?;
    let mut out = BTreeMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek() == Some(&' ') {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            return Some(out);
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some('n') => value.push('\n'),
                        Some('t') => value.push('\t'),
                        Some(other) => value.push(other),
                        None => break,
                    },
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            value = chars.by_ref().take_while(|c| *c != ' ').collect();
        }
        out.insert(key, value);
    }
}

fn endpoint(f: &BTreeMap<String, String>, side: &str, addr_key: &str) -> Endpoint {
    let get = |k: &str| f.get(&format!("{side}.{k}")).cloned().unwrap_or_default();
    let addr = f.get(addr_key).cloned().filter(|a| !a.is_empty()).unwrap_or_else(|| get("addr"));
    let (ip, port) = match addr.parse::<std::net::SocketAddr>() {
        Ok(a) => (a.ip().to_string(), a.port()),
        Err(_) => (addr, 0),
    };
    let (ns, workload) = (get("namespace"), get("workload"));
    Endpoint {
        ip,
        port,
        pod: if workload.is_empty() { String::new() } else { format!("{ns}/{workload}") },
        namespace: ns,
        identity: get("identity"),
        service: get("service").split('.').take(2).collect::<Vec<_>>().iter().rev().copied().collect::<Vec<_>>().join("/"),
    }
}

/// A flow from one line of node `node`'s proxy, logged at `time_ms`, and
/// the policy that refused it (from the proxy's `denied by ...`): the
/// connection was carried (`REDIRECTED`), refused by a policy (`DROPPED
/// POLICY_DENIED`), or failed otherwise (`DROPPED`, the proxy's flag).
pub fn flow(node: &str, time_ms: u64, f: &BTreeMap<String, String>) -> (Flow, Option<String>) {
    let flag = f.get("flag").map(String::as_str).unwrap_or("");
    let error = f.get("error").cloned().unwrap_or_default();
    let (verdict, reason, policy) = match (flag, error.is_empty()) {
        ("DENY", _) => ("DROPPED", "POLICY_DENIED".to_string(), Some(error.strip_prefix("denied by ").unwrap_or(&error).to_string())),
        (_, true) => ("REDIRECTED", String::new(), None),
        (flag, false) => ("DROPPED", if flag.is_empty() { "PROXY_ERROR".to_string() } else { flag.to_string() }, None),
    };
    let direction = f.get("direction").map(String::as_str).unwrap_or("");
    let flow = Flow {
        seq: 0,
        time_ms,
        node: node.to_string(),
        source: endpoint(f, "src", "src.addr"),
        destination: endpoint(f, "dst", "dst.hbone_addr"),
        verdict: verdict.into(),
        drop_reason: reason,
        point: if direction.is_empty() { "node-proxy".into() } else { format!("node-proxy-{direction}") },
        protocol: "TCP".into(),
    };
    (flow, policy)
}

/// A pod log line with the API server's timestamp (`timestamps=true`):
/// Unix milliseconds and the line.
pub fn timestamped(line: &str) -> Option<(u64, &str)> {
    let (t, rest) = line.split_once(' ')?;
    let at = humantime::parse_rfc3339_weak(t.trim_end_matches('Z')).ok().or_else(|| humantime::parse_rfc3339(t).ok())?;
    let ms = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
    Some((u64::try_from(ms).ok()?, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DENIED: &str = r#"connection complete src.addr=10.78.1.6:41780 src.workload=legacy-0 src.namespace=production src.identity=spiffe://cluster.local/ns/production/sa/legacy dst.addr=10.78.2.5:15008 dst.hbone_addr=10.78.2.5:8080 dst.service=billing.production.svc.cluster.local dst.workload=billing-0 dst.namespace=production direction=inbound bytes_sent=0 bytes_recv=0 duration="0ms" error="denied by no allow rule matched (AuthorizationPolicy production/billing)" flag=DENY"#;

    #[test]
    fn lines() {
        let f = fields(DENIED).unwrap();
        assert_eq!(f["error"], "denied by no allow rule matched (AuthorizationPolicy production/billing)");
        assert_eq!(f["duration"], "0ms");
        assert_eq!(f["flag"], "DENY");
        let (flow, policy) = flow("worker-2", 7, &f);
        assert_eq!(
            (flow.verdict.as_str(), flow.drop_reason.as_str(), flow.point.as_str()),
            ("DROPPED", "POLICY_DENIED", "node-proxy-inbound")
        );
        assert_eq!(policy.as_deref(), Some("no allow rule matched (AuthorizationPolicy production/billing)"));
        assert_eq!((flow.source.pod.as_str(), flow.source.port), ("production/legacy-0", 41780));
        assert_eq!((flow.destination.ip.as_str(), flow.destination.port), ("10.78.2.5", 8080), "the pod's port, not HBONE's");
        assert_eq!(flow.destination.service, "production/billing");
        let ok = fields(
            "connection complete src.addr=1.2.3.4:5 dst.addr=5.6.7.8:80 direction=outbound bytes_sent=1 bytes_recv=2 duration=\"1ms\"",
        )
        .unwrap();
        let (carried, policy) = super::flow("n", 0, &ok);
        assert_eq!((carried.verdict.as_str(), policy), ("REDIRECTED", None));
        assert_eq!((carried.destination.port, carried.source.pod.as_str()), (80, ""));
        let refused = fields("connection complete dst.addr=5.6.7.8:80 error=\"connect to 5.6.7.8:80: refused\" flag=CONNECT").unwrap();
        assert_eq!(super::flow("n", 0, &refused).0.drop_reason, "CONNECT");
        let json = r#"{"message":"connection complete","src.addr":"1.2.3.4:5","direction":"inbound","bytes_sent":3,"flag":"DENY","error":"denied by x"}"#;
        assert_eq!(fields(json).unwrap()["bytes_sent"], "3");
        assert!(fields("2026-11-28T10:25:17Z INFO slipstream_node::proxy: mesh configuration changed").is_none());
        assert!(fields(r#"{"message":"starting"}"#).is_none());
    }

    #[test]
    fn timestamps() {
        let (ms, rest) = timestamped("2026-11-28T10:25:17.548098123Z connection complete x=y").unwrap();
        assert_eq!(rest, "connection complete x=y");
        assert_eq!(ms % 1000, 548);
        assert!(timestamped("nonsense").is_none());
    }
}
