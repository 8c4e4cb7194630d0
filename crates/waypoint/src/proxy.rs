//! One request, top to bottom: what it is (its id, trace, token, the view
//! routes and policies read), one [`Decision`] over it
//! ([`crate::decision::decide`]), then the answer the waypoint gives
//! itself or the forwarding ([`crate::forward`]), then its access-log line
//! and metrics.

use crate::body::{text, Body, ReqBody};
use crate::call::Call;
use crate::decision::{self, Checks, Decision, Draws, Refusal, Then};
use crate::flag::Flag;
use crate::forward;
use crate::jwt::{Authenticated, JwtError};
use crate::metrics::{Counted, Pending, Protocol, RequestLabels, Tally};
use crate::peer::Peer;
use crate::plan::{self, Req, Target};
use crate::trace;
use crate::Shared;
use http::header::{HeaderValue, HOST, LOCATION};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use slipstream_core::route::{Filters, RequestView, ServiceRoutes};
use slipstream_core::SpiffeId;
use slipstream_hbone::drain::Stage;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// The header a request is traced by in the access log (set when absent).
pub const REQUEST_ID: &str = "x-request-id";

/// A new `x-request-id`: 128 random bits in hex.
fn request_id() -> HeaderValue {
    let mut hex = [0u8; 32];
    trace::put_hex(&mut hex, rand::random::<u128>());
    HeaderValue::from_bytes(&hex).expect("hex is a header value")
}

/// The request's `x-request-id` (set when absent or not text), and its
/// next `traceparent` (set).
fn stamp(req: &mut Request<Incoming>) -> (HeaderValue, trace::Next) {
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
    let incoming_trace = req.headers().get(trace::TRACEPARENT).and_then(|v| v.to_str().ok());
    let trace = trace::next(incoming_trace, rand::random(), rand::random());
    req.headers_mut().insert(
        http::HeaderName::from_static(trace::TRACEPARENT),
        HeaderValue::from_bytes(trace.header().as_bytes()).expect("hex is a header value"),
    );
    (id, trace)
}

/// RequestAuthentication: the request's token (if it carries one where a
/// rule looks) must be valid; what it establishes is what the policies
/// read, and the request the app gets loses the token and gains the
/// rule's output headers (`jwt`).
fn authenticate(shared: &Shared, routes: Option<&ServiceRoutes>, req: &mut Request<Incoming>) -> Result<Option<Authenticated>, JwtError> {
    let Some(rules) = routes.and_then(|r| shared.jwt_rules_of(r)) else { return Ok(None) };
    // The token is read before the client's copies of the output headers
    // are removed: an output header that names the token's own header must
    // not take the token away unchecked.
    let outcome = crate::jwt::authenticate(&rules, req.headers(), req.uri().query().unwrap_or(""));
    crate::jwt::strip_outputs(&rules, req.headers_mut());
    if let Ok(Some(a)) = &outcome {
        a.apply(req.headers_mut());
    }
    outcome
}

/// What the access log and the metrics say of a request once answered.
struct Answered {
    response: Response<Body>,
    flag: Flag,
    upstream: Option<(SocketAddr, SpiffeId)>,
    attempts: u32,
    /// The policy named in the access log (`-`: none).
    policy: Option<String>,
}

/// The answer to a request the waypoint refuses.
fn refused(r: &Refusal) -> Response<Body> {
    let mut response = text(r.status(), r.body());
    let headers = response.headers_mut();
    if let Some(secs) = r.retry_after() {
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if matches!(r, Refusal::Jwt(e) if e.status() == 401) {
        headers.insert(http::header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"mesh\""));
    }
    response
}

/// Carries `decision` out: the answer the waypoint gives itself, or the
/// request forwarded.
async fn carry_out(call: &Call<'_>, decision: Decision<'_>, req: Request<ReqBody>) -> Answered {
    let answered = |response, flag| Answered { response, flag, upstream: None, attempts: 0, policy: decision.policy.clone() };
    match &decision.then {
        Then::Refuse(r) => answered(refused(r), r.flag()),
        Then::Redirect { status, location } => {
            let mut r = text(*status, String::new());
            if let Ok(v) = HeaderValue::try_from(location.as_str()) {
                r.headers_mut().insert(LOCATION, v);
            }
            answered(r, Flag::None)
        }
        Then::Forward(f) => {
            let none = Filters::default();
            let filters = decision.rule.map_or(&none, |r| &r.filters);
            let r = forward::forward(call, f, filters, req).await;
            Answered {
                response: r.response,
                flag: r.flag,
                upstream: r.upstream,
                attempts: r.attempts,
                policy: r.denied_by.or(decision.policy),
            }
        }
    }
}

pub async fn handle(
    shared: Arc<Shared>,
    target: Arc<Target>,
    peer: Peer,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let start = Instant::now();
    let (id, trace) = stamp(&mut req);
    let id = id.to_str().unwrap_or_default();
    let service_routes = shared.routes_of(&target);
    let authenticated = authenticate(&shared, service_routes.as_deref(), &mut req);
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
    let routes = service_routes.as_deref();
    let decision = decision::decide(
        Checks { path: refused_path, jwt: authenticated.as_ref().err(), authz: &verdict },
        || plan::decide(&state, routes, &|svc: &str| shared.traffic_of(svc), &target, &Req { view, host, draw_backend: rand::random() }),
        // LocalRateLimitPolicy: the service's buckets, if it has routes.
        |rule| routes.map_or(Ok(()), |r| shared.rate_limit(r, rule)),
        Draws::random,
    );
    let rule = decision.rule.map_or("-", |r| r.name.as_str());
    let call = Call { shared: &shared, state: &state, peer: &peer, caller, view, host, id, activity: &activity };
    let a = carry_out(&call, decision, req).await;
    let code = a.response.status().as_u16();
    crate::accesslog::write(&crate::accesslog::RequestLine {
        method,
        path,
        authority: host,
        code,
        flags: a.flag.as_str(),
        route: rule,
        policy: a.policy.as_deref().unwrap_or("-"),
        upstream: a.upstream.as_ref().map(|(a, _)| *a),
        attempts: a.attempts,
        duration_ms: start.elapsed().as_millis() as u64,
        src: &peer.identity,
        dst: a.upstream.as_ref().map(|(_, i)| i),
        request_id: id,
        trace_id: trace.trace_id(),
    });
    let pending =
        Pending { metrics: shared.metrics.clone(), labels: labels(&state, &peer, &target, protocol, &a), start, request: request_bytes };
    let mut response = a.response;
    // Draining: an HTTP/1 client's next request goes to another replica
    // (hyper closes the connection once this answer is sent).
    if version < http::Version::HTTP_2 && shared.drain.stage() >= Stage::Closing {
        response.headers_mut().insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(response.map(|b| Counted::new(b, Tally::default(), Some(pending)).boxed()))
}

/// Istio's request metrics' labels of the answered request, observed when
/// the answer has been sent.
fn labels(state: &slipstream_core::MeshState, peer: &Peer, target: &Target, protocol: Protocol, a: &Answered) -> RequestLabels {
    let src = state.workload_by_ip(peer.addr.ip()).filter(|w| w.identity() == &peer.identity);
    let dst_workload = a.upstream.as_ref().and_then(|(addr, i)| state.workload_by_ip(addr.ip()).filter(|w| w.identity() == i));
    let service = match target {
        Target::Service { service, .. } => Some(service.clone()),
        Target::Workload { .. } => None,
    };
    let code = a.response.status().as_u16();
    let mut labels = RequestLabels::new(
        src.as_deref(),
        peer.identity.uri(),
        service.as_deref(),
        dst_workload.as_deref(),
        protocol,
        code,
        a.flag.as_str(),
    );
    if let Some(code) = crate::metrics::grpc_status(a.response.headers()) {
        labels.grpc_response_status = code;
    }
    labels
}
