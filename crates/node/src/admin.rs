//! The proxy's HTTP endpoints: metrics (:15020), readiness (:15021) and the
//! admin server on loopback (:15000, `/config_dump`).

use crate::config::Config;
use crate::proxy::Shared;
use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::sync::Arc;
use tokio::net::TcpListener;

pub struct Listeners {
    admin: TcpListener,
    stats: TcpListener,
    readiness: TcpListener,
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

type Route = fn(&Shared, &str) -> Response<Full<Bytes>>;

async fn serve_one(l: TcpListener, shared: Arc<Shared>, route: Route) {
    loop {
        let Ok((s, _)) = l.accept().await else { continue };
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: http::Request<Incoming>| {
                let resp = route(&shared, req.uri().path());
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(s), svc).await;
        });
    }
}

fn text(code: StatusCode, ctype: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder().status(code).header("content-type", ctype).body(Full::new(Bytes::from(body))).expect("static response")
}

fn stats(s: &Shared, path: &str) -> Response<Full<Bytes>> {
    match path {
        "/metrics" | "/stats/prometheus" => text(StatusCode::OK, "text/plain; version=0.0.4", s.telemetry.metrics.render()),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "try /metrics\n".into()),
    }
}

fn readiness(_: &Shared, path: &str) -> Response<Full<Bytes>> {
    match path {
        "/healthz/ready" => text(StatusCode::OK, "text/plain", "ready\n".into()),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "try /healthz/ready\n".into()),
    }
}

fn admin(s: &Shared, path: &str) -> Response<Full<Bytes>> {
    match path {
        "/config_dump" => {
            let snap = s.snapshot.borrow().clone();
            let certs: Vec<serde_json::Value> = s
                .certs
                .certificates()
                .into_iter()
                .map(|c| serde_json::json!({"identity": c.identity.to_string(), "state": format!("{:?}", c.status)}))
                .collect();
            let pool: Vec<String> = s.pool.snapshot().into_iter().map(|p| format!("{p:?}")).collect();
            let body = serde_json::json!({
                "config": s.config,
                "workloads": snap.config.workloads,
                "services": snap.config.services,
                "localPods": snap.pods.pods,
                "certificates": certs,
                "pool": pool,
            });
            text(StatusCode::OK, "application/json", serde_json::to_string_pretty(&body).unwrap_or_default())
        }
        "/metrics" => stats(s, path),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "try /config_dump\n".into()),
    }
}
