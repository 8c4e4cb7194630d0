//! DestinationRules: subsets and traffic policies (load balancing,
//! connection pools, outlier detection).

use super::{creation, duration, int_in, reader, spec, Reader};
use super::{DestinationRuleInput, SubsetInput, TrafficInput};
use crate::objects::{Kind, ObjectError, OpaqueObject};
use crate::translate::Labels;
use serde::Deserialize;
use slipstream_core::route::traffic::{HashOn, LoadBalancer, OutlierDetection};
use std::time::Duration;

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct DrSpec {
    #[serde(default)]
    host: String,
    traffic_policy: Option<TrafficSpec>,
    #[serde(default)]
    subsets: Vec<SubsetSpec>,
    #[serde(default)]
    export_to: Vec<String>,
    workload_selector: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SubsetSpec {
    name: String,
    #[serde(default)]
    labels: Labels,
    traffic_policy: Option<TrafficSpec>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct TrafficSpec {
    load_balancer: Option<LbSpec>,
    connection_pool: Option<PoolSpec>,
    outlier_detection: Option<OutlierSpec>,
    tls: Option<TlsSpec>,
    #[serde(default)]
    port_level_settings: Vec<serde_json::Value>,
    tunnel: Option<serde_json::Value>,
    proxy_protocol: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LbSpec {
    simple: Option<String>,
    consistent_hash: Option<HashSpec>,
    locality_lb_setting: Option<serde_json::Value>,
    warmup_duration_secs: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HashSpec {
    http_header_name: Option<String>,
    http_cookie: Option<CookieSpec>,
    use_source_ip: Option<bool>,
    http_query_parameter_name: Option<String>,
    // The hash function: ours is rendezvous hashing whatever is asked
    // (the same stickiness; docs/waypoint.md).
    ring_hash: Option<serde_json::Value>,
    maglev: Option<serde_json::Value>,
    minimum_ring_size: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct CookieSpec {
    name: String,
    path: Option<String>,
    ttl: Option<String>,
}

#[derive(Deserialize)]
struct PoolSpec {
    tcp: Option<TcpPoolSpec>,
    http: Option<HttpPoolSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TcpPoolSpec {
    max_connections: Option<i64>,
    connect_timeout: Option<String>,
    tcp_keepalive: Option<serde_json::Value>,
    max_connection_duration: Option<String>,
    idle_timeout: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HttpPoolSpec {
    http1_max_pending_requests: Option<i64>,
    http2_max_requests: Option<i64>,
    max_requests_per_connection: Option<i64>,
    max_retries: Option<i64>,
    idle_timeout: Option<String>,
    h2_upgrade_policy: Option<String>,
    use_client_protocol: Option<bool>,
    max_concurrent_streams: Option<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OutlierSpec {
    consecutive_errors: Option<i64>,
    #[serde(rename = "consecutive5xxErrors")]
    consecutive_5xx_errors: Option<i64>,
    consecutive_gateway_errors: Option<i64>,
    consecutive_local_origin_failures: Option<i64>,
    split_external_local_origin_errors: Option<bool>,
    interval: Option<String>,
    base_ejection_time: Option<String>,
    max_ejection_percent: Option<i64>,
    min_health_percent: Option<i64>,
}

#[derive(Deserialize)]
struct TlsSpec {
    mode: Option<String>,
}

/// Reads a DestinationRule. Every error names the field, from `spec.` on.
/// Its host is resolved in the cluster domain `domain_suffix`.
pub fn destination_rule(o: &OpaqueObject, domain_suffix: &str) -> Result<DestinationRuleInput, ObjectError> {
    let rd = reader(o, Kind::DestinationRule, domain_suffix)?;
    let spec: DrSpec = spec(&rd, o)?;
    if spec.workload_selector.is_some() {
        return Err(rd.unsupported("spec.workloadSelector", "a DestinationRule here applies to every caller of its host"));
    }
    let _ = spec.export_to;
    let (host, wildcard) = if spec.host.is_empty() {
        return Err(rd.err("spec.host", "required: the service this rule is about"));
    } else if spec.host == "*" || spec.host.starts_with("*.") {
        (String::new(), Some(spec.host.clone()))
    } else {
        (rd.service_key(&spec.host, "spec.host")?, None)
    };
    let base = spec.traffic_policy.map(|t| traffic(&rd, t, "spec.trafficPolicy")).transpose()?;
    let mut subsets: Vec<SubsetInput> = Vec::new();
    for (i, s) in spec.subsets.into_iter().enumerate() {
        let f = format!("spec.subsets[{i}]");
        if s.name.is_empty() {
            return Err(rd.err(format!("{f}.name"), "required"));
        }
        if subsets.iter().any(|o| o.name == s.name) {
            return Err(rd.err(format!("{f}.name"), format!("{:?} is named twice", s.name)));
        }
        let t = s.traffic_policy.map(|t| traffic(&rd, t, &format!("{f}.trafficPolicy"))).transpose()?;
        subsets.push(SubsetInput { name: s.name, labels: s.labels, traffic: t });
    }
    Ok(DestinationRuleInput {
        namespace: rd.r.namespace.clone(),
        name: rd.r.name.clone(),
        creation: creation(o),
        host,
        wildcard,
        traffic: base,
        subsets,
    })
}

fn positive(rd: &Reader, v: i64, field: &str) -> Result<u32, ObjectError> {
    int_in(rd, v, 1, i64::from(u32::MAX), field)
}

fn traffic(rd: &Reader, t: TrafficSpec, f: &str) -> Result<TrafficInput, ObjectError> {
    for (field, set) in [
        ("portLevelSettings", !t.port_level_settings.is_empty()),
        ("tunnel", t.tunnel.is_some()),
        ("proxyProtocol", t.proxy_protocol.is_some()),
    ] {
        if set {
            return Err(rd.unsupported(format!("{f}.{field}"), "the waypoint applies a policy to the whole service or subset"));
        }
    }
    if let Some(tls) = &t.tls {
        // In the mesh every hop is mutual TLS with the mesh's identities:
        // ISTIO_MUTUAL is what happens anyway, and DISABLE cannot turn it
        // off. Originating TLS to the app is not supported.
        match tls.mode.as_deref() {
            None | Some("ISTIO_MUTUAL") | Some("DISABLE") => {}
            Some(m) => return Err(rd.unsupported(format!("{f}.tls.mode"), &format!("{m}: the mesh's own mutual TLS is ISTIO_MUTUAL"))),
        }
    }
    let lb = t.load_balancer.map(|l| load_balancer(rd, l, &format!("{f}.loadBalancer"))).transpose()?;
    let pool = match t.connection_pool {
        None => None,
        Some(p) => Some(pool(rd, p, &format!("{f}.connectionPool"))?),
    };
    let outlier = t.outlier_detection.map(|o| outlier(rd, o, &format!("{f}.outlierDetection"))).transpose()?;
    Ok(TrafficInput { lb, pool, outlier })
}

fn load_balancer(rd: &Reader, l: LbSpec, f: &str) -> Result<LoadBalancer, ObjectError> {
    for (field, set) in [("localityLbSetting", l.locality_lb_setting.is_some()), ("warmupDurationSecs", l.warmup_duration_secs.is_some())] {
        if set {
            return Err(rd.unsupported(format!("{f}.{field}"), "endpoints are balanced without locality or warm-up"));
        }
    }
    match (l.simple, l.consistent_hash) {
        (Some(_), Some(_)) => Err(rd.err(f, "simple and consistentHash are exclusive")),
        (Some(s), None) => match s.as_str() {
            "UNSPECIFIED" | "LEAST_REQUEST" | "LEAST_CONN" => Ok(LoadBalancer::LeastRequest),
            "ROUND_ROBIN" => Ok(LoadBalancer::RoundRobin),
            "RANDOM" => Ok(LoadBalancer::Random),
            "PASSTHROUGH" => Err(rd.unsupported(format!("{f}.simple"), "PASSTHROUGH: the waypoint always chooses a mesh endpoint")),
            other => Err(rd.err(format!("{f}.simple"), format!("{other:?} is not ROUND_ROBIN, LEAST_REQUEST or RANDOM"))),
        },
        (None, Some(h)) => {
            let _ = (h.ring_hash, h.maglev, h.minimum_ring_size);
            let g = format!("{f}.consistentHash");
            let keys = [
                h.http_header_name.is_some(),
                h.http_cookie.is_some(),
                h.use_source_ip == Some(true),
                h.http_query_parameter_name.is_some(),
            ];
            if keys.iter().filter(|k| **k).count() != 1 {
                return Err(rd.err(g, "exactly one of httpHeaderName, httpCookie, useSourceIp or httpQueryParameterName is required"));
            }
            if let Some(name) = h.http_header_name {
                return Ok(LoadBalancer::Hash(HashOn::Header(name.to_ascii_lowercase())));
            }
            if let Some(c) = h.http_cookie {
                if c.ttl.is_some() || c.path.is_some() {
                    let field = if c.ttl.is_some() { "ttl" } else { "path" };
                    return Err(rd.unsupported(
                        format!("{g}.httpCookie.{field}"),
                        "the waypoint hashes on a cookie the client sends; it does not set one",
                    ));
                }
                return Ok(LoadBalancer::Hash(HashOn::Cookie(c.name)));
            }
            if let Some(q) = h.http_query_parameter_name {
                return Ok(LoadBalancer::Hash(HashOn::Query(q)));
            }
            Ok(LoadBalancer::Hash(HashOn::SourceIp))
        }
        (None, None) => Ok(LoadBalancer::LeastRequest),
    }
}

/// `connectionPool`: the bound on requests in flight it implies, as
/// Envoy's circuit breakers would let them through: `http2MaxRequests`, or
/// `tcp.maxConnections` connections each with a request plus
/// `http1MaxPendingRequests` waiting.
fn pool(rd: &Reader, p: PoolSpec, f: &str) -> Result<Option<u32>, ObjectError> {
    let mut max_conns = None;
    if let Some(t) = p.tcp {
        for (field, set) in [
            ("connectTimeout", t.connect_timeout.is_some()),
            ("tcpKeepalive", t.tcp_keepalive.is_some()),
            ("maxConnectionDuration", t.max_connection_duration.is_some()),
            ("idleTimeout", t.idle_timeout.is_some()),
        ] {
            if set {
                return Err(rd.unsupported(
                    format!("{f}.tcp.{field}"),
                    "the waypoint's tunnels are the node proxies' (HBONE); only maxConnections applies",
                ));
            }
        }
        max_conns = t.max_connections.map(|v| positive(rd, v, &format!("{f}.tcp.maxConnections"))).transpose()?;
    }
    let (mut pending, mut h2) = (None, None);
    if let Some(h) = p.http {
        for (field, set) in [
            ("maxRequestsPerConnection", h.max_requests_per_connection.is_some()),
            ("maxRetries", h.max_retries.is_some()),
            ("idleTimeout", h.idle_timeout.is_some()),
            ("h2UpgradePolicy", h.h2_upgrade_policy.is_some()),
            ("useClientProtocol", h.use_client_protocol.is_some()),
            ("maxConcurrentStreams", h.max_concurrent_streams.is_some()),
        ] {
            if set {
                return Err(rd.unsupported(
                    format!("{f}.http.{field}"),
                    "the waypoint bounds requests in flight (http2MaxRequests, or tcp.maxConnections plus http1MaxPendingRequests)",
                ));
            }
        }
        pending = h.http1_max_pending_requests.map(|v| positive(rd, v, &format!("{f}.http.http1MaxPendingRequests"))).transpose()?;
        h2 = h.http2_max_requests.map(|v| positive(rd, v, &format!("{f}.http.http2MaxRequests"))).transpose()?;
    }
    Ok(match (h2, max_conns) {
        (Some(n), _) => Some(n),
        (None, Some(c)) => Some(c.saturating_add(pending.unwrap_or(0))),
        (None, None) => pending,
    })
}

fn outlier(rd: &Reader, o: OutlierSpec, f: &str) -> Result<OutlierDetection, ObjectError> {
    for (field, set) in [
        ("consecutiveLocalOriginFailures", o.consecutive_local_origin_failures.is_some()),
        ("splitExternalLocalOriginErrors", o.split_external_local_origin_errors.is_some()),
    ] {
        if set {
            return Err(rd.unsupported(format!("{f}.{field}"), "every failure counts as the endpoint's"));
        }
    }
    // `interval` is how often Envoy sweeps; ejection here happens at the
    // failure that crosses the bound. `minHealthPercent` has no effect
    // either (docs/waypoint.md).
    if let Some(i) = &o.interval {
        duration(|m| rd.err(format!("{f}.interval"), m), i)?;
    }
    let _ = o.min_health_percent;
    let count = |v: Option<i64>, field: &str| v.map(|v| int_in(rd, v, 0, i64::from(u32::MAX), &format!("{f}.{field}"))).transpose();
    // Istio: the deprecated consecutiveErrors counts gateway errors; 0
    // turns a counter off.
    let gateway = count(o.consecutive_gateway_errors, "consecutiveGatewayErrors")?.or(count(o.consecutive_errors, "consecutiveErrors")?);
    let five = count(o.consecutive_5xx_errors, "consecutive5xxErrors")?;
    // Envoy's default when neither is given: 5 consecutive 5xx.
    let (five, gateway) = match (five, gateway) {
        (None, None) => (Some(5), None),
        other => other,
    };
    let base = match &o.base_ejection_time {
        None => Duration::from_secs(30),
        Some(b) => duration(|m| rd.err(format!("{f}.baseEjectionTime"), m), b)?.unwrap_or(Duration::from_secs(30)),
    };
    Ok(OutlierDetection {
        consecutive_5xx: five.filter(|n| *n > 0),
        consecutive_gateway: gateway.filter(|n| *n > 0),
        base_ejection: base,
        max_ejection_percent: o
            .max_ejection_percent
            .map(|v| int_in(rd, v, 0, 100, &format!("{f}.maxEjectionPercent")))
            .transpose()?
            .unwrap_or(10),
    })
}
