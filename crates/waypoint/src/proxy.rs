//! One request: decide ([`crate::plan::decide`]), then answer it here or
//! send it to the chosen endpoint, applying the rule's header filters and
//! timeout, with one access-log line.

use crate::metrics::{Counted, Pending, Protocol, RequestLabels, Tally};
use crate::peer::Peer;
use crate::plan::{self, Action, Req, Target};
use crate::trace;
use crate::Shared;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, HOST, LOCATION};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use slipstream_core::route::traffic;
use slipstream_core::route::{Backend, Filters, HeaderModifier, RequestView};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

pub type Body = BoxBody<Bytes, hyper::Error>;

/// A request's body, its bytes counted for `istio_request_bytes`, its
/// activity watched for the request-body timeout.
type ReqBody = Counted<crate::fair::Watched<Incoming>>;

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

/// The largest body held in memory to be sent more than once (to a
/// mirror, or again on a retry). A request with a larger (or streamed)
/// body is forwarded once, without mirror or retry, and the access log
/// says so.
const REPLAY_BODY_LIMIT: u64 = 1 << 20;

/// The body, read whole when it is at most [`REPLAY_BODY_LIMIT`], its
/// length is known (or it is already complete) and the replay budget has
/// room for it (the permit, held until the request is done); otherwise
/// given back.
/// The budget a replayed body is held under: the permit of the whole
/// waypoint's and the client's own share.
type Held = (tokio::sync::OwnedSemaphorePermit, crate::fair::Share);

/// Why a body could not be read whole to be replayed.
enum NotBuffered {
    /// Too large, streamed, or over a budget: sent once as it comes.
    Stream(Box<ReqBody>),
    /// The client stopped sending it (the request-body timeout).
    Stalled,
}

async fn buffer(
    shared: &Shared,
    client: std::net::IpAddr,
    activity: &crate::fair::BodyActivity,
    headers: &HeaderMap,
    body: ReqBody,
) -> Result<(Bytes, Option<Held>), NotBuffered> {
    let length = headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let chunked = headers.contains_key(http::header::TRANSFER_ENCODING);
    let small = match length {
        Some(n) => n <= REPLAY_BODY_LIMIT,
        None => !chunked && hyper::body::Body::is_end_stream(&body),
    };
    if !small {
        return Err(NotBuffered::Stream(Box::new(body)));
    }
    let kib = length.unwrap_or(0).div_ceil(1024) as u32;
    let permit = if kib == 0 {
        None
    } else {
        // The client's own share first: one client cannot hold the budget
        // every client's retries and mirrors draw on.
        let Some(share) = shared.replay_shares.take(client, kib) else { return Err(NotBuffered::Stream(Box::new(body))) };
        match shared.replay_budget.clone().try_acquire_many_owned(kib) {
            Ok(p) => Some((p, share)),
            Err(_) => return Err(NotBuffered::Stream(Box::new(body))),
        }
    };
    let collect = http_body_util::Limited::new(body, REPLAY_BODY_LIMIT as usize).collect();
    let bytes = tokio::select! {
        r = collect => match r {
            Ok(c) => c.to_bytes(),
            // The client broke off: nothing to forward either.
            Err(_) => Bytes::new(),
        },
        () = activity.stalled(shared.settings.fairness.request_body_timeout) => return Err(NotBuffered::Stalled),
    };
    Ok((bytes, permit))
}

fn full(b: Bytes) -> Body {
    Full::new(b).map_err(|never: Infallible| match never {}).boxed()
}

/// How long a mirrored request may take: its answer is dropped anyway,
/// and what it holds (its body) must not outlive a slow mirror for long.
const MIRROR_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// RequestMirror: a copy of the request to each mirror backend (one of its
/// endpoints, of its subset if it names one), `Host` suffixed `-shadow` as
/// Envoy does, its answer discarded. Each copy takes its body's share of
/// the replay budget until it is done (at most [`MIRROR_TIMEOUT`]): a slow
/// mirror cannot make the waypoint hold more than the budget; past it, the
/// copy is not sent.
#[allow(clippy::too_many_arguments)]
fn mirror(
    shared: &Arc<Shared>,
    state: &slipstream_core::MeshState,
    peer: &Peer,
    caller: plan::Caller<'_>,
    request: (&RequestView<'_>, &str),
    mirrors: &[Backend],
    parts: &http::request::Parts,
    path_and_query: &str,
    bytes: &Bytes,
) {
    for m in mirrors {
        let Some(svc) = state.service(&m.service) else { continue };
        let mut eps = state.endpoints(&svc, m.port);
        if let Some(s) = &m.subset {
            eps.retain(|e| s.workloads.binary_search(&e.workload.uid).is_ok());
        }
        let Some(ep) = slipstream_core::MeshState::pick(&eps, rand::random()) else { continue };
        let addr = std::net::SocketAddr::new(ep.workload.address(), ep.target_port);
        // A copy is a request to that endpoint too: its own policies and
        // the source's egress decide it, as for the original.
        if shared.source_egress(state, peer, addr).is_err()
            || shared.authorize_endpoint(state, &ep.workload, addr, caller, Some(request), "-").is_err()
        {
            continue;
        }
        let Ok(uri) = http::Uri::try_from(path_and_query) else { continue };
        // The client's own bound of copies in flight, then its share of
        // the bodies held and the whole waypoint's.
        let client = peer.addr.ip();
        let Some(copy) = shared.mirror_shares.take(client, 1) else {
            tracing::debug!(peer = %client, "mirror not sent: the client has its bound of copies in flight");
            continue;
        };
        let kib = (bytes.len() as u64).div_ceil(1024) as u32;
        let permit = if kib == 0 {
            None
        } else {
            let Some(share) = shared.replay_shares.take(client, kib) else { continue };
            match shared.replay_budget.clone().try_acquire_many_owned(kib) {
                Ok(p) => Some((p, share)),
                Err(_) => continue,
            }
        };
        let mut req = Request::new(full(bytes.clone()));
        *req.method_mut() = parts.method.clone();
        *req.uri_mut() = uri;
        *req.version_mut() = parts.version;
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
            let _held = (permit, copy);
            let _ = tokio::time::timeout(MIRROR_TIMEOUT, async move {
                if let Ok(resp) = client.send(addr, req).await {
                    let _ = resp.into_body().collect().await;
                }
            })
            .await;
        });
    }
}

/// How forwarding went: the answer, Envoy's response flag, the last
/// endpoint tried (address and identity) and the attempts made.
struct Forwarded {
    response: Response<Body>,
    flag: &'static str,
    upstream: Option<(std::net::SocketAddr, slipstream_core::SpiffeId)>,
    attempts: u32,
    /// The selector-bound policy of the endpoint that refused it.
    denied_by: Option<String>,
}

/// One request to the endpoints of `f`: fault injection, mirroring, then
/// attempts (retries to another endpoint when the rule allows), each
/// bounded by the attempt timeout and all by the request timeout.
#[allow(clippy::too_many_arguments)]
async fn forward(
    shared: &Arc<Shared>,
    state: &slipstream_core::MeshState,
    peer: &Peer,
    caller: plan::Caller<'_>,
    f: plan::Forward,
    filters: &Filters,
    req: Request<ReqBody>,
    activity: &crate::fair::BodyActivity,
    host: &str,
    view: &RequestView<'_>,
    id: &str,
) -> Forwarded {
    let (view_headers, query) = (view.headers, view.query);
    let answer = |status: u16, text_: String, flag: &'static str, attempts: u32| Forwarded {
        response: text(status, text_),
        flag,
        upstream: None,
        denied_by: None,
        attempts,
    };
    if let Some(fault) = &f.fault {
        if let Some(d) = &fault.delay {
            if traffic::chance(d.per_million, rand::random()) {
                tokio::time::sleep(d.delay).await;
            }
        }
        if let Some(a) = &fault.abort {
            if traffic::chance(a.per_million, rand::random()) {
                return answer(a.status, "fault filter abort\n".into(), "FI", 0);
            }
        }
    }
    let start = Instant::now();
    let deadline = f.timeout.map(|t| start + t);
    let (mut parts, body) = req.into_parts();
    // The rule's rewrite, else the request's authority: HTTP/2 from the
    // client has no Host, and HTTP/1.1 to the endpoint needs exactly one.
    let one_host = {
        let mut all = parts.headers.get_all(HOST).iter();
        all.next().is_some() && all.next().is_none()
    };
    let new_host = match &f.host {
        Some(h) => Some(h.as_str()),
        None if !one_host => Some(host),
        None => None,
    };
    if let Some(Ok(v)) = new_host.map(HeaderValue::try_from) {
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
    // gRPC needs `te: trailers` end to end over HTTP/2; any other `te` is
    // hop-by-hop.
    let h2 = parts.version == http::Version::HTTP_2;
    let keep_te = h2 && parts.headers.get(http::header::TE).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    // Most requests have none of them: one pass over the names decides.
    let dropped = |k: &HeaderName| HOP_BY_HOP.contains(&k.as_str()) || IDENTITY_HEADERS.contains(&k.as_str());
    if !named.is_empty() || parts.headers.keys().any(dropped) {
        for h in HOP_BY_HOP.iter().chain(IDENTITY_HEADERS).copied().chain(named.iter().map(String::as_str)) {
            if !(keep_te && h == "te") {
                parts.headers.remove(h);
            }
        }
    }
    // The upstream speaks what the client spoke to the service: HTTP/2
    // (prior knowledge) for HTTP/2, else HTTP/1.1.
    parts.version = if h2 { http::Version::HTTP_2 } else { http::Version::HTTP_11 };
    modify(&mut parts.headers, &filters.request_headers);
    let mirrored = !filters.mirrors.is_empty() && filters.mirror_per_million.map_or(true, |p| traffic::chance(p, rand::random()));
    let retries = f.retry.as_ref().map_or(0, |r| r.attempts);
    // The body, whole when it must be sent more than once.
    let (mut once, replay, _held) = if mirrored || retries > 0 {
        match buffer(shared, peer.addr.ip(), activity, &parts.headers, body).await {
            Ok((b, permit)) => (None, Some(b), permit),
            Err(NotBuffered::Stalled) => return answer(408, "request body timeout\n".into(), "-", 0),
            Err(NotBuffered::Stream(stream)) => {
                let stream = *stream;
                tracing::info!(
                    target: slipstream_core::ACCESS_LOG_TARGET,
                    request_id = id,
                    "not mirrored nor retried: the body is larger than 1 MiB, streamed, or the waypoint (or this client's share) holds as many bodies as it may"
                );
                (Some(stream), None, None)
            }
        }
    } else {
        (Some(body), None, None)
    };
    if let (true, Some(b)) = (mirrored, &replay) {
        mirror(shared, state, peer, caller, (view, host), &filters.mirrors, &parts, &f.path_and_query, b);
    }
    let retries = if replay.is_some() { retries } else { 0 };
    let key = crate::balance::hash_key(&f.traffic.lb, view_headers, query, peer.addr.ip());
    // Copied for an attempt only when another may follow it.
    let mut parts = Some(parts);
    let mut tried: Vec<std::net::SocketAddr> = Vec::new();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let slot = match shared.balancer.start(&f, key, &tried, [rand::random(), rand::random()]) {
            Ok(s) => s,
            Err(crate::balance::NoSlot::Overflow(max)) => {
                return answer(
                    503,
                    format!("upstream overflow: {max} requests in flight to {} (DestinationRule connectionPool)\n", f.pool),
                    "UO",
                    attempt - 1,
                )
            }
        };
        let ep = slot.addr;
        let upstream = Some((ep, slot.endpoint.workload.identity().clone()));
        tried.push(ep);
        if let Err(d) = shared.source_egress(state, peer, ep) {
            shared.balancer.finish(&f, slot, Some(200));
            return Forwarded { response: text(403, format!("{d}\n")), flag: "RBAC", upstream, attempts: attempt, denied_by: None };
        }
        // The endpoint's own policies, which its waypoint enforces with the
        // original client (docs/waypoint.md, "Policy").
        if let Err(by) = shared.authorize_endpoint(state, &slot.endpoint.workload, ep, caller, Some((view, host)), id) {
            shared.balancer.finish(&f, slot, Some(200));
            return Forwarded {
                response: text(403, "RBAC: access denied\n".into()),
                flag: "RBAC",
                upstream,
                attempts: attempt,
                denied_by: by,
            };
        }
        let mut p = match parts.take() {
            Some(p) if attempt <= retries => {
                let copy = p.clone();
                parts = Some(p);
                copy
            }
            Some(p) => p,
            // Never: the attempt that takes them is the last.
            None => return answer(500, "internal error: the request was already sent\n".into(), "-", attempt),
        };
        // Origin form; the client makes it absolute for HTTP/2.
        p.uri = match http::Uri::try_from(f.path_and_query.as_str()) {
            Ok(u) => u,
            Err(_) => {
                shared.balancer.finish(&f, slot, Some(200));
                return answer(400, "the request's path cannot be forwarded\n".into(), "-", attempt);
            }
        };
        let body = match (&replay, once.take()) {
            (Some(b), _) => full(b.clone()),
            (None, Some(stream)) => stream.boxed(),
            (None, None) => full(Bytes::new()),
        };
        let sent = shared.client.send(ep, Request::from_parts(p, body));
        let bound = match (f.attempt_timeout, crate::balance::remaining(deadline)) {
            (Some(a), Some(r)) => Some(a.min(r)),
            (a, r) => a.or(r),
        };
        // The answer, unless the attempt times out or the client stops
        // sending the body before it comes.
        let body_timeout = shared.settings.fairness.request_body_timeout;
        let result = tokio::select! {
            r = async {
                match bound {
                    Some(t) => tokio::time::timeout(t, sent).await.ok(),
                    None => Some(sent.await),
                }
            } => r,
            () = activity.stalled(body_timeout) => {
                shared.balancer.finish(&f, slot, None);
                return answer(408, "request body timeout\n".into(), "-", attempt);
            }
        };
        let outcome = match &result {
            Some(Ok(resp)) => traffic::Attempt::Status(resp.status().as_u16()),
            Some(Err(e)) if e.is_connect() => traffic::Attempt::ConnectFailure,
            Some(Err(_)) => traffic::Attempt::Reset,
            // A timed-out attempt is a 504, which 5xx and gateway-error retry.
            None => traffic::Attempt::Status(504),
        };
        let status = match outcome {
            traffic::Attempt::Status(s) if result.as_ref().is_some_and(|r| r.is_ok()) => Some(s),
            _ => None,
        };
        shared.balancer.finish(&f, slot, status);
        let overall_left = crate::balance::remaining(deadline).map_or(true, |r| !r.is_zero());
        let again = attempt <= retries && overall_left && f.retry.as_ref().is_some_and(|r| r.on.retries(outcome));
        if again {
            tracing::debug!(upstream = %ep, ?outcome, attempt, "retrying on another endpoint");
            continue;
        }
        return match result {
            Some(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                modify(&mut parts.headers, &filters.response_headers);
                Forwarded { response: Response::from_parts(parts, body.boxed()), flag: "-", upstream, attempts: attempt, denied_by: None }
            }
            Some(Err(e)) => {
                tracing::debug!(upstream = %ep, "upstream request failed: {e}");
                let flag = if e.is_connect() { "UF" } else { "UC" };
                Forwarded {
                    response: text(503, format!("upstream connect error: {e}\n")),
                    flag,
                    upstream,
                    attempts: attempt,
                    denied_by: None,
                }
            }
            None if !overall_left || f.attempt_timeout.is_none() => Forwarded {
                response: text(504, "upstream request timeout\n".into()),
                flag: "UT",
                upstream,
                attempts: attempt,
                denied_by: None,
            },
            None => Forwarded {
                response: text(504, "upstream request timeout (per try)\n".into()),
                flag: "UT",
                upstream,
                attempts: attempt,
                denied_by: None,
            },
        };
    }
}

/// A new `x-request-id`: 128 random bits in hex.
fn request_id() -> HeaderValue {
    let mut hex = [0u8; 32];
    trace::put_hex(&mut hex, rand::random::<u128>());
    HeaderValue::from_bytes(&hex).expect("hex is a header value")
}

pub async fn handle(
    shared: Arc<Shared>,
    target: Arc<Target>,
    peer: Peer,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let start = Instant::now();
    // Kept (a shared copy, not a String) for the access log.
    let id = match req.headers().get(REQUEST_ID) {
        Some(v) if v.to_str().is_ok() => v.clone(),
        _ => {
            let v = request_id();
            // A static name: inserting a `&str` copies it each time.
            req.headers_mut().insert(http::HeaderName::from_static(REQUEST_ID), v.clone());
            v
        }
    };
    let id = id.to_str().unwrap_or_default();
    let incoming_trace = req.headers().get(trace::TRACEPARENT).and_then(|v| v.to_str().ok());
    let trace = trace::next(incoming_trace, rand::random(), rand::random());
    req.headers_mut().insert(
        http::HeaderName::from_static(trace::TRACEPARENT),
        HeaderValue::from_bytes(trace.header().as_bytes()).expect("hex is a header value"),
    );
    // RequestAuthentication first: the request's token (if it carries one
    // where a rule looks) must be valid; what it establishes is what the
    // policies read, and the request the app gets loses the token and
    // gains the rule's output headers (`jwt`).
    let service_routes = shared.routes_of(&target);
    let jwt_rules = service_routes.as_deref().and_then(|r| shared.jwt_rules_of(r));
    let authenticated = match &jwt_rules {
        Some(rules) => {
            // The token is read before the client's copies of the output
            // headers are removed: an output header that names the token's
            // own header must not take the token away unchecked.
            let outcome = crate::jwt::authenticate(rules, req.headers(), req.uri().query().unwrap_or(""));
            crate::jwt::strip_outputs(rules, req.headers_mut());
            if let Ok(Some(a)) = &outcome {
                a.apply(req.headers_mut());
            }
            outcome
        }
        None => Ok(None),
    };
    let protocol = match req.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) {
        Some(c) if c.starts_with("application/grpc") => Protocol::Grpc,
        _ => Protocol::Http,
    };
    let version = req.version();
    // What routes, policies and the access log read, kept apart from the
    // request that goes on: copies that share the parsed bytes (a header
    // map's copy is two allocations, not two per header).
    let (method, uri, header_map) = (req.method().clone(), req.uri().clone(), req.headers().clone());
    // The path as MeshConfig says to normalize it (`core::path`), before
    // anything reads it: routes, policies, the access log and the request
    // the endpoint receives all see this one.
    let normalized = slipstream_core::path::normalize(uri.path(), shared.settings_mesh.load().path_normalization);
    let refused_path = normalized.as_ref().err().copied();
    let path = normalized.unwrap_or(std::borrow::Cow::Borrowed(uri.path()));
    let (method, path, query) = (method.as_str(), path.as_ref(), uri.query().unwrap_or(""));
    let host = header_map.get(HOST).and_then(|v| v.to_str().ok()).or(uri.authority().map(|a| a.as_str())).unwrap_or("");
    let headers: Vec<(&str, &str)> = header_map.iter().filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?))).collect();
    let state = shared.mesh.load_full();
    let view = RequestView { method, path, query, headers: &headers };
    let request_bytes = Tally::default();
    let activity = crate::fair::BodyActivity::new();
    let req = req.map(|b| Counted::new(crate::fair::Watched::new(b, activity.clone()), request_bytes.clone(), None));
    // Authorization first: a denied request learns nothing of the routes.
    let caller = plan::Caller { auth: authenticated.as_ref().ok().and_then(|a| a.as_ref()).map(|a| &a.auth), ..shared.caller(&peer) };
    let verdict = plan::authorize(service_routes.as_deref(), &target, caller, Some((&view, host)));
    for d in &verdict.dry_run_denials {
        tracing::info!(target: slipstream_core::ACCESS_LOG_TARGET, policy = %format!("{}/{}", d.namespace, d.name), "dry-run: {method} {path} would be denied");
    }
    let mut policy: std::borrow::Cow<'_, str> = match &verdict.by {
        Some(b) => format!("{}/{}", b.namespace, b.name).into(),
        None => "-".into(),
    };
    let mut attempts = 0u32;
    let mut rule = "-";
    let (response, flag, upstream) = if let Some(e) = refused_path {
        (text(400, format!("path refused: {e}\n")), "DPE", None)
    } else if let Err(e) = &authenticated {
        // The access log names the RequestAuthentication that refused it.
        policy = e.policy().to_string().into();
        let mut r = text(e.status(), format!("{e}\n"));
        if e.status() == 401 {
            r.headers_mut().insert(http::header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"mesh\""));
        }
        (r, "-", None)
    } else if !verdict.allowed {
        (text(403, "RBAC: access denied\n".into()), "RBAC", None)
    } else {
        let decision = plan::decide(
            &state,
            service_routes.as_deref(),
            &|svc: &str| shared.traffic_of(svc),
            &target,
            &Req { view, host, draw_backend: rand::random() },
        );
        rule = decision.rule.map_or("-", |r| r.name.as_str());
        let filters = decision.rule.map(|r| r.filters.clone()).unwrap_or_default();
        // LocalRateLimitPolicy: requests the waypoint would route, not
        // those it answers itself (404, 503 without endpoints).
        let limited = match (&decision.action, service_routes.as_deref()) {
            (Action::Forward(_) | Action::Redirect { .. }, Some(r)) => shared.rate_limit(r, decision.rule.map(|r| r.name.as_str())).err(),
            _ => None,
        };
        if let Some((by, wait)) = limited {
            let mut r = text(429, "local_rate_limited\n".into());
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            r.headers_mut().insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            // The access log names the policy that limited it.
            policy = by.into();
            (r, "RL", None)
        } else {
            match decision.action {
                Action::Respond { status, flag, detail } => (text(status, format!("{detail}\n")), flag, None),
                Action::Redirect { status, location } => {
                    let mut r = text(status, String::new());
                    if let Ok(v) = HeaderValue::try_from(location) {
                        r.headers_mut().insert(LOCATION, v);
                    }
                    (r, "-", None)
                }
                Action::Forward(f) => {
                    let view = RequestView { method, path, query, headers: &headers };
                    let r = forward(&shared, &state, &peer, caller, *f, &filters, req, &activity, host, &view, id).await;
                    attempts = r.attempts;
                    if let Some(by) = r.denied_by {
                        policy = by.into();
                    }
                    (r.response, r.flag, r.upstream)
                }
            }
        }
    };
    let code = response.status().as_u16();
    crate::accesslog::write(&crate::accesslog::RequestLine {
        method,
        path,
        authority: host,
        code,
        flags: flag,
        route: rule,
        policy: &policy,
        upstream: upstream.as_ref().map(|(a, _)| *a),
        attempts,
        duration_ms: start.elapsed().as_millis() as u64,
        src: &peer.identity,
        dst: upstream.as_ref().map(|(_, i)| i),
        request_id: id,
        trace_id: trace.trace_id(),
    });
    // Istio's request metrics, observed when the answer has been sent.
    let src = state.workload_by_ip(peer.addr.ip()).filter(|w| w.identity() == &peer.identity);
    let dst_workload = upstream.as_ref().and_then(|(a, i)| state.workload_by_ip(a.ip()).filter(|w| w.identity() == i));
    let service = match &*target {
        Target::Service { service, .. } => Some(service.clone()),
        Target::Workload { .. } => None,
    };
    let mut labels =
        RequestLabels::new(src.as_deref(), peer.identity.uri(), service.as_deref(), dst_workload.as_deref(), protocol, code, flag);
    if let Some(code) = crate::metrics::grpc_status(response.headers()) {
        labels.grpc_response_status = code;
    }
    let pending = Pending { metrics: shared.metrics.clone(), labels, start, request: request_bytes };
    let mut response = response;
    // Draining: an HTTP/1 client's next request goes to another replica
    // (hyper closes the connection once this answer is sent).
    if version < http::Version::HTTP_2 && *shared.drain.borrow() >= crate::Drain::Closing {
        response.headers_mut().insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(response.map(|b| Counted::new(b, Tally::default(), Some(pending)).boxed()))
}
