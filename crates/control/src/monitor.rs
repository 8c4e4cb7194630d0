//! The control plane's monitoring port (:15014, loopback by default, as
//! istiod's): `/ready` for the supervisor's probe, `/debug/syncz` for
//! `slipstream proxy-status` and `slipstream apply` (what each proxy was
//! sent and acknowledged), `/debug/resources` (counts by type).
//!
//! Bounded like the node proxy's admin ports: HTTP/1.1, a header timeout, a
//! deadline per connection and a cap on open connections.

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

const MAX_CONNECTIONS: usize = 32;
const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);

/// What the monitor shows; the run loop provides it.
pub trait MonitorSource: Send + Sync + 'static {
    /// Ok when the control plane serves (source synced, listener up), else why not.
    fn ready(&self) -> Result<(), String>;
    /// `/debug/syncz`: JSON.
    fn syncz(&self) -> serde_json::Value;
    /// `/debug/resources`: JSON.
    fn resources(&self) -> serde_json::Value;
}

fn text(code: StatusCode, ctype: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder().status(code).header("content-type", ctype).body(Full::new(Bytes::from(body))).expect("valid response")
}

fn route(src: &dyn MonitorSource, path: &str) -> Response<Full<Bytes>> {
    let json = |v: serde_json::Value| text(StatusCode::OK, "application/json", serde_json::to_string_pretty(&v).unwrap_or_default());
    match path {
        "/ready" => match src.ready() {
            Ok(()) => text(StatusCode::OK, "text/plain", "ready\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("{why}\n")),
        },
        "/debug/syncz" => json(src.syncz()),
        "/debug/resources" => json(src.resources()),
        _ => text(StatusCode::NOT_FOUND, "text/plain", "try /ready, /debug/syncz or /debug/resources\n".into()),
    }
}

/// Serves until the task is dropped.
pub async fn serve(listener: TcpListener, src: Arc<dyn MonitorSource>) {
    let open = Arc::new(AtomicUsize::new(0));
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("monitor port: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if open.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        let (src, open) = (src.clone(), open.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let resp = route(&*src, req.uri().path());
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(2))
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(CONNECTION_DEADLINE, conn).await;
            open.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Result<(), String>);
    impl MonitorSource for Fixed {
        fn ready(&self) -> Result<(), String> {
            self.0.clone()
        }
        fn syncz(&self) -> serde_json::Value {
            serde_json::json!({"proxies": []})
        }
        fn resources(&self) -> serde_json::Value {
            serde_json::json!({"Address": 0})
        }
    }

    #[test]
    fn routes() {
        let ok = Fixed(Ok(()));
        assert_eq!(route(&ok, "/ready").status(), StatusCode::OK);
        assert_eq!(route(&ok, "/debug/syncz").status(), StatusCode::OK);
        assert_eq!(route(&ok, "/nope").status(), StatusCode::NOT_FOUND);
        let not = Fixed(Err("source not synced yet".into()));
        assert_eq!(route(&not, "/ready").status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
