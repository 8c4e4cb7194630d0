//! One request: decide ([`crate::plan::decide`]), then answer it here or
//! send it to the chosen endpoint, applying the rule's header filters and
//! timeout, with one access-log line.

use crate::handler::Peer;
use crate::plan::{self, Action, Req, Target};
use crate::Shared;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, HOST, LOCATION};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use slipstream_core::route::{HeaderModifier, RequestView};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

pub type Body = BoxBody<Bytes, hyper::Error>;

/// The header a request is traced by in the access log (set when absent).
pub const REQUEST_ID: &str = "x-request-id";

/// Hop-by-hop headers (RFC 9110 section 7.6.1): not forwarded.
const HOP_BY_HOP: &[&str] = &["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"];

/// Headers that say who the caller is: only the mesh may set them, so a
/// client's own are dropped, never passed on as if verified.
const IDENTITY_HEADERS: &[&str] = &["forwarded", "x-forwarded-client-cert", "x-slipstream-peer"];

fn text(status: u16, body: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).map_err(|never: Infallible| match never {}).boxed());
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

fn modify(headers: &mut HeaderMap, m: &HeaderModifier) {
    for (k, v) in &m.set {
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k.as_str()), HeaderValue::try_from(v.as_str())) {
            headers.insert(k, v);
        }
    }
    for (k, v) in &m.add {
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k.as_str()), HeaderValue::try_from(v.as_str())) {
            headers.append(k, v);
        }
    }
    for k in &m.remove {
        headers.remove(k.as_str());
    }
}

/// The largest body a mirrored request may have: it is held in memory to
/// be sent twice. A request with a larger (or unknown, streamed) body is
/// forwarded without its mirror, and the access log says so.
const MIRROR_BODY_LIMIT: u64 = 1 << 20;

/// RequestMirror: a copy of the request to each mirror backend (one of its
/// endpoints), `Host` suffixed `-shadow` as Envoy does, its answer
/// discarded; the original's body, read once, for the original.
async fn mirror(
    shared: &Arc<Shared>,
    state: &slipstream_core::MeshState,
    mirrors: &[slipstream_core::route::Backend],
    parts: &http::request::Parts,
    path_and_query: &str,
    body: Incoming,
    id: &str,
) -> Body {
    use http_body_util::BodyExt;
    let length = parts.headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let chunked = parts.headers.contains_key(http::header::TRANSFER_ENCODING);
    let small = match length {
        Some(n) => n <= MIRROR_BODY_LIMIT,
        None => !chunked && hyper::body::Body::is_end_stream(&body),
    };
    if !small {
        tracing::info!(target: slipstream_core::ACCESS_LOG_TARGET, request_id = id, "not mirrored: the body is larger than 1 MiB or streamed");
        return body.boxed();
    }
    let bytes = match http_body_util::Limited::new(body, MIRROR_BODY_LIMIT as usize).collect().await {
        Ok(c) => c.to_bytes(),
        // The client broke off: nothing to forward either.
        Err(_) => Bytes::new(),
    };
    for m in mirrors {
        let Some(svc) = state.service(&m.service) else { continue };
        let eps = state.endpoints(&svc, m.port);
        let Some(ep) = slipstream_core::MeshState::pick(&eps, rand::random()) else { continue };
        let addr = std::net::SocketAddr::new(ep.workload.address(), ep.target_port);
        let Ok(uri) = format!("http://{addr}{path_and_query}").parse::<http::Uri>() else { continue };
        let mut req = Request::new(Full::new(bytes.clone()).map_err(|never: Infallible| match never {}).boxed());
        *req.method_mut() = parts.method.clone();
        *req.uri_mut() = uri;
        *req.headers_mut() = parts.headers.clone();
        if let Some(h) = parts.headers.get(HOST).and_then(|v| v.to_str().ok()) {
            let (name, port) = h.rsplit_once(':').map_or((h, None), |(n, p)| (n, Some(p)));
            let shadow = match port {
                Some(p) => format!("{name}-shadow:{p}"),
                None => format!("{name}-shadow"),
            };
            if let Ok(v) = HeaderValue::try_from(shadow) {
                req.headers_mut().insert(HOST, v);
            }
        }
        let client = shared.client.clone();
        tokio::spawn(async move {
            if let Ok(resp) = client.request(req).await {
                let _ = resp.into_body().collect().await;
            }
        });
    }
    Full::new(bytes).map_err(|never: Infallible| match never {}).boxed()
}

fn request_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

pub async fn handle(
    shared: Arc<Shared>,
    target: Arc<Target>,
    peer: Peer,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let start = Instant::now();
    let id = match req.headers().get(REQUEST_ID).and_then(|v| v.to_str().ok()) {
        Some(v) => v.to_string(),
        None => {
            let v = request_id();
            req.headers_mut().insert(REQUEST_ID, HeaderValue::try_from(v.as_str()).expect("hex is a header value"));
            v
        }
    };
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let host =
        req.headers().get(HOST).and_then(|v| v.to_str().ok()).or(req.uri().authority().map(|a| a.as_str())).unwrap_or("").to_string();
    let headers: Vec<(String, String)> =
        req.headers().iter().filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string()))).collect();
    let state = shared.mesh.load_full();
    let service_routes = shared.routes_of(&target);
    let view = RequestView { method: &method, path: &path, query: &query, headers: &headers };
    // Authorization first: a denied request learns nothing of the routes.
    let verdict = plan::authorize(service_routes.as_deref(), &target, &peer.identity, peer.addr.ip(), Some((&view, &host)));
    for d in &verdict.dry_run_denials {
        tracing::info!(target: slipstream_core::ACCESS_LOG_TARGET, policy = %format!("{}/{}", d.namespace, d.name), "dry-run: {method} {path} would be denied");
    }
    let policy = verdict.by.as_ref().map(|b| format!("{}/{}", b.namespace, b.name)).unwrap_or_else(|| "-".into());
    if !verdict.allowed {
        tracing::info!(
            target: slipstream_core::ACCESS_LOG_TARGET,
            method = %method,
            path = %path,
            authority = %host,
            code = 403u16,
            flags = "RBAC",
            policy = %policy,
            duration_ms = start.elapsed().as_millis() as u64,
            src = %peer.identity,
            request_id = %id,
            "request"
        );
        return Ok(text(403, "RBAC: access denied\n".into()));
    }
    let decision = plan::decide(
        &state,
        service_routes.as_deref(),
        &target,
        &Req { view, host: &host, draw_backend: rand::random(), draw_endpoint: rand::random() },
    );
    let rule = decision.rule.map(|r| r.name.clone()).unwrap_or_else(|| "-".into());
    let filters = decision.rule.map(|r| r.filters.clone()).unwrap_or_default();
    let (response, flag, upstream) = match decision.action {
        Action::Respond { status, flag, detail } => (text(status, format!("{detail}\n")), flag, None),
        Action::Redirect { status, location } => {
            let mut r = text(status, String::new());
            if let Ok(v) = HeaderValue::try_from(location) {
                r.headers_mut().insert(LOCATION, v);
            }
            (r, "-", None)
        }
        Action::Forward(f) => 'forward: {
            let ep = std::net::SocketAddr::new(f.endpoint.workload.address(), f.endpoint.target_port);
            if let Err(d) = shared.source_egress(&state, &peer, ep) {
                break 'forward (text(403, format!("{d}\n")), "RBAC", Some((ep, f.endpoint.workload.identity().to_string())));
            }
            let (mut parts, body) = req.into_parts();
            parts.uri = match format!("http://{ep}{}", f.path_and_query).parse() {
                Ok(u) => u,
                Err(_) => return Ok(text(400, "the request's path cannot be forwarded\n".into())),
            };
            // HTTP/2 from the client has no Host; HTTP/1.1 to the endpoint needs it.
            let new_host = f.host.clone().unwrap_or_else(|| host.clone());
            if let Ok(v) = HeaderValue::try_from(new_host) {
                parts.headers.insert(HOST, v);
            }
            // Headers the client's `Connection` names are hop-by-hop too.
            let named: Vec<String> = parts
                .headers
                .get_all(http::header::CONNECTION)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(',').map(|h| h.trim().to_ascii_lowercase()).collect::<Vec<_>>())
                .filter(|h| h != "host")
                .collect();
            for h in HOP_BY_HOP.iter().chain(IDENTITY_HEADERS).copied().chain(named.iter().map(String::as_str)) {
                parts.headers.remove(h);
            }
            parts.version = http::Version::HTTP_11;
            modify(&mut parts.headers, &filters.request_headers);
            let body = if filters.mirrors.is_empty() {
                body.boxed()
            } else {
                mirror(&shared, &state, &filters.mirrors, &parts, &f.path_and_query, body, &id).await
            };
            let upstream_req = Request::from_parts(parts, body);
            let sent = shared.client.request(upstream_req);
            // None: the rule's timeout passed first.
            let result = match f.timeout {
                Some(t) => tokio::time::timeout(t, sent).await.ok(),
                None => Some(sent.await),
            };
            match result {
                Some(Ok(resp)) => {
                    let (mut parts, body) = resp.into_parts();
                    modify(&mut parts.headers, &filters.response_headers);
                    (Response::from_parts(parts, body.boxed()), "-", Some((ep, f.endpoint.workload.identity().to_string())))
                }
                Some(Err(e)) => {
                    tracing::debug!(upstream = %ep, "upstream request failed: {e:?}");
                    (text(503, format!("upstream connect error: {e}\n")), "UF", Some((ep, f.endpoint.workload.identity().to_string())))
                }
                None => (text(504, "upstream request timeout\n".into()), "UT", Some((ep, f.endpoint.workload.identity().to_string()))),
            }
        }
    };
    let (up, dst) = upstream.map_or(("-".to_string(), "-".to_string()), |(a, i)| (a.to_string(), i));
    tracing::info!(
        target: slipstream_core::ACCESS_LOG_TARGET,
        method = %method,
        path = %path,
        authority = %host,
        code = response.status().as_u16(),
        flags = flag,
        route = %rule,
        policy = %policy,
        upstream = %up,
        duration_ms = start.elapsed().as_millis() as u64,
        src = %peer.identity,
        dst = %dst,
        request_id = %id,
        "request"
    );
    Ok(response)
}
