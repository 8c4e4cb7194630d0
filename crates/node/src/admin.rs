//! The proxy's HTTP endpoints: metrics (:15020), readiness (:15021) and the
//! admin server on loopback (:15000, `/config_dump`).
//!
//! Reachable by anyone who can reach the node, so each listener bounds what
//! a client can hold: HTTP/1.1 only, a header-read timeout, a deadline for
//! the whole connection, and a cap on open connections in total and per
//! source IP (over it, a connection is closed at once and counted).
//! Connections from the node's own loopback (the agent's readiness probe,
//! an operator's curl) draw on caps of their own: no pod can come from the
//! node's loopback, so no pod can fill the slots the probe needs and make
//! the agent restart the proxy.

use crate::config::Config;
use crate::state::Shared;
use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use slipstream_hbone::ResponseFlag;
use slipstream_proxy::limits::{KeyedGuard, KeyedSlots, SlotGuard, Slots};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

pub struct Listeners {
    admin: TcpListener,
    stats: TcpListener,
    readiness: TcpListener,
}

impl Listeners {
    /// The admin, stats and readiness addresses as bound.
    pub fn addrs(&self) -> (std::net::SocketAddr, std::net::SocketAddr, std::net::SocketAddr) {
        let a = |l: &TcpListener| l.local_addr().expect("bound listener");
        (a(&self.admin), a(&self.stats), a(&self.readiness))
    }
}

pub async fn bind(c: &Config) -> anyhow::Result<Listeners> {
    let b = |a| async move { TcpListener::bind(a).await.map_err(|e| anyhow::anyhow!("cannot listen on {a}: {e}")) };
    Ok(Listeners { admin: b(c.admin_addr).await?, stats: b(c.stats_addr).await?, readiness: b(c.readiness_addr).await? })
}

pub fn serve(l: Listeners, shared: Arc<Shared>) {
    tokio::spawn(serve_one(l.admin, shared.clone(), admin));
    tokio::spawn(serve_one(l.stats, shared.clone(), stats));
    tokio::spawn(serve_one(l.readiness, shared, readiness));
}

/// An endpoint: the shared state, the path, and the client's address.
type Route = fn(&Shared, &str, IpAddr) -> Response<Full<Bytes>>;

/// One listener's caps: open connections in total and per source IP, and
/// a separate total for the node's own loopback.
struct Gate {
    total: Arc<Slots>,
    per_source: Arc<KeyedSlots<IpAddr>>,
    loopback: Arc<Slots>,
}

impl Gate {
    fn new(total: u32, per_source: u32) -> Gate {
        Gate { total: Slots::new(total), per_source: KeyedSlots::new(per_source), loopback: Slots::new(total) }
    }
}

/// Why a connection to an admin port was refused: its flag and its
/// `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Refused {
    flag: ResponseFlag,
    reason: &'static str,
}

/// The slots an admitted connection holds until it closes: one of its
/// listener's total (or loopback) slots, and its source's.
struct AdminHeld {
    _slot: SlotGuard,
    _source: Option<KeyedGuard<IpAddr>>,
}

/// Whether a new connection from `ip` fits; the guards hold its place. A
/// source over its own cap is SOURCE_LIMIT; a full listener is OVERLOAD
/// (nobody's fault in particular).
fn admit(g: &Gate, ip: IpAddr) -> Result<AdminHeld, Refused> {
    let ip = ip.to_canonical();
    if ip.is_loopback() {
        let held = g.loopback.try_acquire(1).ok_or(Refused { flag: ResponseFlag::Overload, reason: "admin_loopback_limit" })?;
        return Ok(AdminHeld { _slot: held, _source: None });
    }
    let source = g.per_source.try_acquire(ip).ok_or(Refused { flag: ResponseFlag::SourceLimit, reason: "admin_source_limit" })?;
    let total = g.total.try_acquire(1).ok_or(Refused { flag: ResponseFlag::Overload, reason: "admin_limit" })?;
    Ok(AdminHeld { _slot: total, _source: Some(source) })
}

async fn serve_one(l: TcpListener, shared: Arc<Shared>, route: Route) {
    let limits = &shared.config.limits;
    let gate = Gate::new(limits.admin_connections, limits.admin_connections_per_source);
    let port = l.local_addr().map(|a| a.port()).unwrap_or_default();
    loop {
        let (s, peer) = match l.accept().await {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors, typically: back off rather than spin.
                tracing::warn!(port, "accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let held = match admit(&gate, peer.ip()) {
            Ok(h) => h,
            Err(Refused { flag, reason }) => {
                shared.telemetry.metrics.rejected_because(flag, reason);
                if shared.telemetry.log_refusal(&peer.ip().to_canonical().to_string()) {
                    tracing::warn!(target: crate::telemetry::REFUSAL_TARGET, %peer, port, reason, %flag, "connection to an admin port refused: too many open connections");
                }
                crate::sockets::reset(&s);
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _held = held;
            let (header_timeout, deadline) = (shared.config.limits.admin_header_timeout, shared.config.limits.admin_connection_deadline);
            let metrics = shared.clone();
            let svc = service_fn(move |req: http::Request<Incoming>| {
                let resp = route(&shared, req.uri().path(), peer.ip());
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(s), svc);
            let reason = match tokio::time::timeout(deadline, conn).await {
                Ok(Ok(())) => return,
                Ok(Err(e)) if e.is_timeout() => "admin_header_timeout",
                Ok(Err(_)) => return,
                Err(_) => "admin_deadline",
            };
            metrics.telemetry.metrics.rejected_because(ResponseFlag::Timeout, reason);
        });
    }
}

fn text(code: StatusCode, ctype: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder().status(code).header("content-type", ctype).body(Full::new(Bytes::from(body))).expect("static response")
}

fn stats(s: &Shared, path: &str, _: IpAddr) -> Response<Full<Bytes>> {
    match path {
        "/metrics" | "/stats/prometheus" => {
            text(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", s.telemetry.metrics.render())
        }
        _ => text(StatusCode::NOT_FOUND, "text/plain", "try /metrics\n".into()),
    }
}

/// 200 `ready`, or 503 with one line per reason (see `ready`). The
/// reasons name pods, identities and CA errors: only the node's own
/// loopback (the agent's probe, an operator) reads them; anyone else, pods
/// included, gets `not ready`.
fn readiness(s: &Shared, path: &str, client: IpAddr) -> Response<Full<Bytes>> {
    match path {
        "/healthz/ready" => match s.ready() {
            Ok(()) => text(StatusCode::OK, "text/plain", "ready\n".into()),
            Err(why) if client.to_canonical().is_loopback() => text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", why.join("\n") + "\n"),
            Err(_) => text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready\n".into()),
        },
        _ => text(StatusCode::NOT_FOUND, "text/plain", "try /healthz/ready\n".into()),
    }
}

fn admin(s: &Shared, path: &str, client: IpAddr) -> Response<Full<Bytes>> {
    match path {
        "/config_dump" => {
            let snap = s.snapshot();
            let certs: Vec<serde_json::Value> = s
                .certs
                .certificates()
                .into_iter()
                .map(|c| {
                    use slipstream_identity::CertStatus;
                    let t = |t: std::time::SystemTime| slipstream_identity::format_time(t);
                    match c.status {
                        CertStatus::Pending => serde_json::json!({"identity": c.identity.to_string(), "state": "PENDING"}),
                        CertStatus::Ready { serial, not_before, not_after, renew_at } => serde_json::json!({
                            "identity": c.identity.to_string(), "state": "VALID", "serial": serial,
                            "notBefore": t(not_before), "notAfter": t(not_after), "renewAt": t(renew_at),
                        }),
                        CertStatus::Failed { error } => {
                            serde_json::json!({"identity": c.identity.to_string(), "state": "FAILED", "error": error})
                        }
                    }
                })
                .collect();
            let pool: Vec<String> = s.pool.snapshot().into_iter().map(|p| format!("{p:?}")).collect();
            let mut local: Vec<serde_json::Value> = s
                .pods
                .all()
                .into_iter()
                .map(|p| serde_json::json!({"uid": &*p.uid, "ip": p.ip, "openConnections": p.conns.len()}))
                .collect();
            local.sort_by_key(|v| v["uid"].as_str().map(str::to_owned));
            let mut workloads: Vec<&slipstream_core::Workload> = snap.workloads().map(|w| w.workload()).collect();
            workloads.sort_by(|a, b| a.uid.cmp(&b.uid));
            let mut services: Vec<&slipstream_core::Service> = snap.services().map(|s| s.service()).collect();
            services.sort_by(|a, b| (&a.namespace, &a.hostname).cmp(&(&b.namespace, &b.hostname)));
            let mut policies: Vec<&slipstream_core::policy::Authorization> = snap.policies().map(|p| p.as_ref()).collect();
            policies.sort_by_key(|p| p.key());
            let mut net_policies: Vec<&slipstream_core::policy::network::NetPolicy> = snap.net_policies().map(|p| p.as_ref()).collect();
            net_policies.sort_by_key(|p| p.key());
            let body = serde_json::json!({
                "config": s.config,
                "readiness": s.ready().err().unwrap_or_default(),
                "workloads": workloads,
                "services": services,
                "policies": policies,
                "networkPolicies": net_policies,
                "localPods": local,
                "certificates": certs,
                "pool": pool,
            });
            text(StatusCode::OK, "application/json", serde_json::to_string_pretty(&body).unwrap_or_default())
        }
        "/metrics" => stats(s, path, client),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "try /config_dump\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_as_a_table() {
        // Caps: 3 in total, 2 per source, and 3 for the node's loopback.
        let g = Gate::new(3, 2);
        let (a, b, c): (IpAddr, IpAddr, IpAddr) =
            ("10.244.1.3".parse().unwrap(), "10.244.2.4".parse().unwrap(), "10.0.0.7".parse().unwrap());
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let mapped_lo: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let source = Some(("SOURCE_LIMIT", "admin_source_limit"));
        let full = Some(("OVERLOAD", "admin_limit"));
        // (source, refused with) in order; what is admitted stays held.
        let steps: &[(IpAddr, Option<(&str, &str)>)] = &[
            (a, None),
            (a, None),
            (a, source),
            (b, None),
            (b, full),
            (c, full),
            // The listener is full for everyone else, not for the node's
            // own loopback (the agent's probe): it has its own slots.
            (lo, None),
            (mapped_lo, None),
            (lo, None),
            (lo, Some(("OVERLOAD", "admin_loopback_limit"))),
        ];
        let mut held = Vec::new();
        for (i, (ip, want)) in steps.iter().enumerate() {
            match admit(&g, *ip) {
                Ok(h) => {
                    assert_eq!(*want, None, "step {i}: {ip} admitted");
                    held.push(h);
                }
                Err(r) => assert_eq!(Some((r.flag.as_str(), r.reason)), *want, "step {i}: {ip}"),
            }
        }
        assert_eq!((g.total.in_use(), g.loopback.in_use(), g.per_source.in_use(a), g.per_source.in_use(b)), (3, 3, 2, 1));
        assert_eq!(g.per_source.in_use(c), 0, "a refusal for the total gives the source's slot back");
        drop(held);
        assert_eq!((g.total.in_use(), g.loopback.in_use(), g.per_source.keys()), (0, 0, 0));
    }
}
