//! Calls from one bookinfo service to another: an HTTP/1.1 client with a
//! deadline, trace/user header propagation and a bounded answer size.
//!
//! No connection pooling, like the real bookinfo: each call is a new
//! connection, so an L4 balancer (kube-proxy, nftables, a node proxy) spreads
//! calls over every version instead of pinning one keep-alive connection to
//! one backend.

use std::error::Error as StdError;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, ACCEPT, COOKIE, USER_AGENT};
use http::uri::Authority;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// Deadline for a whole upstream call (connect, answer, body), as in the real
/// bookinfo: a slow dependency degrades the page instead of hanging it.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(3);

/// Bookinfo answers are a few hundred bytes; anything far larger is a bug.
const MAX_ANSWER: usize = 1024 * 1024;

/// Headers copied from the incoming request to every upstream call: trace
/// context (so a trace spans the call graph), and the user identity the L7
/// mesh routes on (`end-user`, `cookie`).
pub(crate) const PROPAGATED: [HeaderName; 12] = [
    HeaderName::from_static("x-request-id"),
    HeaderName::from_static("traceparent"),
    HeaderName::from_static("tracestate"),
    HeaderName::from_static("b3"),
    HeaderName::from_static("x-b3-traceid"),
    HeaderName::from_static("x-b3-spanid"),
    HeaderName::from_static("x-b3-parentspanid"),
    HeaderName::from_static("x-b3-sampled"),
    HeaderName::from_static("x-b3-flags"),
    HeaderName::from_static("end-user"),
    USER_AGENT,
    COOKIE,
];

/// The headers of `incoming` that an upstream call carries on.
pub(crate) fn propagated(incoming: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in &PROPAGATED {
        for value in incoming.get_all(name) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// A failed upstream call; its text is what the degraded answer shows.
#[derive(Debug, thiserror::Error)]
#[error("{service} at {authority}: {cause}")]
pub(crate) struct UpstreamError {
    service: &'static str,
    authority: Authority,
    cause: Cause,
}

#[derive(Debug, thiserror::Error)]
enum Cause {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("request failed: {0}")]
    Request(String),
    #[error("answered {0}")]
    Status(StatusCode),
    #[error("answer body failed: {0}")]
    Body(String),
    #[error("answer is not JSON: {0}")]
    Json(serde_json::Error),
}

/// The client every service uses for its upstreams; cheap to clone.
#[derive(Clone)]
pub(crate) struct Upstream {
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Upstream {
    pub(crate) fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(TIMEOUT));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build(connector);
        Upstream { client }
    }

    /// `GET http://<authority><path>` with the propagated headers of the
    /// incoming request; the answer must be a 2xx JSON document.
    pub(crate) async fn get_json(
        &self,
        service: &'static str,
        authority: &Authority,
        path: &str,
        incoming: &HeaderMap,
    ) -> Result<Value, UpstreamError> {
        let fail = |cause| UpstreamError { service, authority: authority.clone(), cause };
        let call = async {
            let uri = format!("http://{authority}{path}");
            let mut req = Request::get(uri).body(Empty::new()).map_err(|e| Cause::Request(e.to_string()))?;
            *req.headers_mut() = propagated(incoming);
            req.headers_mut().insert(ACCEPT, HeaderValue::from_static("application/json"));
            let resp = self.client.request(req).await.map_err(|e| Cause::Request(chain(&e)))?;
            if !resp.status().is_success() {
                return Err(Cause::Status(resp.status()));
            }
            let body = Limited::new(resp.into_body(), MAX_ANSWER).collect().await.map_err(|e| Cause::Body(chain(e.as_ref())))?.to_bytes();
            serde_json::from_slice(&body).map_err(Cause::Json)
        };
        match tokio::time::timeout(TIMEOUT, call).await {
            Ok(result) => result.map_err(fail),
            Err(_) => Err(fail(Cause::Timeout(TIMEOUT))),
        }
    }
}

/// An error and its causes on one line: hyper's own text ("client error
/// (Connect)") hides the useful part ("Connection refused") in its sources.
fn chain(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_headers_are_propagated_with_all_their_values() {
        let mut incoming = HeaderMap::new();
        incoming.insert("end-user", HeaderValue::from_static("jason"));
        incoming.insert("x-request-id", HeaderValue::from_static("abc"));
        incoming.append("cookie", HeaderValue::from_static("a=1"));
        incoming.append("cookie", HeaderValue::from_static("b=2"));
        incoming.insert("authorization", HeaderValue::from_static("secret"));
        incoming.insert("host", HeaderValue::from_static("productpage"));
        let out = propagated(&incoming);
        assert_eq!(out.get("end-user").unwrap(), "jason");
        assert_eq!(out.get("x-request-id").unwrap(), "abc");
        assert_eq!(out.get_all("cookie").iter().collect::<Vec<_>>(), ["a=1", "b=2"]);
        assert!(out.get("authorization").is_none() && out.get("host").is_none());
        assert_eq!(out.len(), 4);
    }

    #[tokio::test]
    async fn a_refused_connection_is_reported_with_its_cause() {
        // Bind then drop, so the port is (almost certainly) closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let authority: Authority = format!("127.0.0.1:{port}").parse().unwrap();
        let err = Upstream::new().get_json("ratings", &authority, "/ratings/0", &HeaderMap::new()).await.unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with(&format!("ratings at 127.0.0.1:{port}: request failed")), "{text}");
        assert!(text.to_lowercase().contains("refused"), "{text}");
    }
}
