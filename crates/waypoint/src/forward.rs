//! One forwarded request, carried out as its [`Decision`] says: the fault
//! drawn for it, the mirrored copy, then the attempts (each to an endpoint
//! the balancer picks, under the endpoint's own policies and the attempt's
//! bound; again on another endpoint while the retry policy allows and the
//! overall timeout has time left).
//!
//! [`Decision`]: crate::decision::Decision

use crate::balance::{self, NoSlot};
use crate::body::{full, text, Body, ReqBody};
use crate::call::Call;
use crate::decision::{Attempts, Forwarding};
use crate::flag::Flag;
use crate::plan;
use crate::replay::{self, NotHeld};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use slipstream_core::route::traffic::Attempt;
use slipstream_core::route::Filters;
use slipstream_core::SpiffeId;
use std::net::SocketAddr;
use std::time::Instant;

/// How forwarding went: the answer, its response flag, the last endpoint
/// tried (address and identity) and the attempts made.
pub struct Forwarded {
    pub response: Response<Body>,
    pub flag: Flag,
    pub upstream: Option<(SocketAddr, SpiffeId)>,
    pub attempts: u32,
    /// The policy of the endpoint that refused it.
    pub denied_by: Option<String>,
}

impl Forwarded {
    /// The waypoint's own answer, after `attempts`.
    fn answer(status: u16, body: String, flag: Flag, attempts: u32) -> Forwarded {
        Forwarded { response: text(status, body), flag, upstream: None, attempts, denied_by: None }
    }
}

/// The request's body for each attempt: held whole to be sent again, or
/// streamed once.
// One per request, held in the forwarding future and never in a
// collection: boxing the streamed body would cost an allocation per
// request for nothing.
#[allow(clippy::large_enum_variant)]
enum Payload {
    Held(Bytes),
    Once(Option<ReqBody>),
}

impl Payload {
    fn next(&mut self) -> Body {
        match self {
            Payload::Held(b) => full(b.clone()),
            Payload::Once(once) => match once.take() {
                Some(stream) => stream.boxed(),
                None => full(Bytes::new()),
            },
        }
    }
}

/// Sends `req` as `f` says: the fault first, then the body held if it must
/// be sent more than once (a mirror, a retry), the mirrored copy, and the
/// attempts.
pub async fn forward(call: &Call<'_>, f: &Forwarding, filters: &Filters, req: Request<ReqBody>) -> Forwarded {
    let policy = &f.attempts;
    if let Some(d) = policy.delay {
        tokio::time::sleep(d).await;
    }
    if let Some(status) = policy.abort {
        return Forwarded::answer(status, "fault filter abort\n".into(), Flag::FaultInjected, 0);
    }
    let deadline = policy.overall.map(|t| Instant::now() + t);
    let (mut parts, body) = req.into_parts();
    crate::headers::outgoing(&mut parts, f.route.host.as_deref(), call.host, &filters.request_headers);
    // The body, whole when it must be sent more than once.
    let (payload, _held) = if policy.mirror || policy.retries > 0 {
        match replay::hold(call, &parts.headers, body).await {
            Ok((b, permit)) => (Payload::Held(b), permit),
            Err(NotHeld::Stalled) => return Forwarded::answer(408, "request body timeout\n".into(), Flag::None, 0),
            Err(NotHeld::Stream(stream)) => {
                tracing::info!(
                    target: slipstream_core::ACCESS_LOG_TARGET,
                    request_id = call.id,
                    "not mirrored nor retried: the body is larger than 1 MiB, streamed, or the waypoint (or this client's share) holds as many bodies as it may"
                );
                (Payload::Once(Some(*stream)), None)
            }
        }
    } else {
        (Payload::Once(Some(body)), None)
    };
    if let (true, Payload::Held(b)) = (policy.mirror, &payload) {
        replay::mirror(call, &filters.mirrors, &parts, &f.route.path_and_query, b);
    }
    let retries = if matches!(payload, Payload::Held(_)) { policy.retries } else { 0 };
    let key = balance::hash_key(&f.route.traffic.lb, call.view.headers, call.view.query, call.peer.addr.ip());
    let mut tries =
        Tries { call, route: &f.route, policy, filters, retries, deadline, key, parts: Some(parts), payload, tried: Vec::new() };
    tries.run().await
}

/// The attempts at one request, and what they have used.
struct Tries<'a, 'c> {
    call: &'a Call<'c>,
    route: &'a plan::Forward,
    policy: &'a Attempts,
    filters: &'a Filters,
    /// Attempts after the first this request may make (0 when its body is
    /// streamed).
    retries: u32,
    deadline: Option<Instant>,
    key: Option<u64>,
    /// Copied for an attempt only when another may follow it.
    parts: Option<http::request::Parts>,
    payload: Payload,
    tried: Vec<SocketAddr>,
}

impl Tries<'_, '_> {
    async fn run(&mut self) -> Forwarded {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            if let Some(f) = self.attempt(attempt).await {
                return f;
            }
        }
    }

    /// Attempt number `attempt`: an endpoint, its policies, the request
    /// sent within the attempt's bound. None: tried again, on another
    /// endpoint.
    async fn attempt(&mut self, attempt: u32) -> Option<Forwarded> {
        let (call, f) = (self.call, self.route);
        let shared = call.shared;
        let slot = match shared.balancer.start(f, self.key, &self.tried, [rand::random(), rand::random()]) {
            Ok(s) => s,
            Err(NoSlot::Overflow(max)) => {
                let why = format!("upstream overflow: {max} requests in flight to {} (DestinationRule connectionPool)\n", f.pool);
                return Some(Forwarded::answer(503, why, Flag::UpstreamOverflow, attempt - 1));
            }
        };
        let ep = slot.addr;
        let upstream = Some((ep, slot.endpoint.workload.identity().clone()));
        self.tried.push(ep);
        let denied =
            |response, denied_by| Some(Forwarded { response, flag: Flag::Rbac, upstream: upstream.clone(), attempts: attempt, denied_by });
        if let Err(d) = shared.source_egress(call.state, call.peer, ep) {
            shared.balancer.finish(f, slot, Some(200));
            return denied(text(403, format!("{d}\n")), None);
        }
        // The endpoint's own policies, which its waypoint enforces with the
        // original client (docs/waypoint.md, "Policy").
        if let Err(by) =
            shared.authorize_endpoint(call.state, &slot.endpoint.workload, ep, call.caller, Some((&call.view, call.host)), call.id)
        {
            shared.balancer.finish(f, slot, Some(200));
            return denied(text(403, "RBAC: access denied\n".into()), by);
        }
        let mut p = match self.parts.take() {
            Some(p) if attempt <= self.retries => {
                let copy = p.clone();
                self.parts = Some(p);
                copy
            }
            Some(p) => p,
            // Never: the attempt that takes them is the last.
            None => return Some(Forwarded::answer(500, "internal error: the request was already sent\n".into(), Flag::None, attempt)),
        };
        // Origin form; the client makes it absolute for HTTP/2.
        p.uri = match http::Uri::try_from(f.path_and_query.as_str()) {
            Ok(u) => u,
            Err(_) => {
                shared.balancer.finish(f, slot, Some(200));
                return Some(Forwarded::answer(400, "the request's path cannot be forwarded\n".into(), Flag::None, attempt));
            }
        };
        let sent = shared.client.send(ep, Request::from_parts(p, self.payload.next()));
        let bound = match (self.policy.per_try, balance::remaining(self.deadline)) {
            (Some(a), Some(r)) => Some(a.min(r)),
            (a, r) => a.or(r),
        };
        // The answer, unless the attempt times out or the client stops
        // sending the body before it comes.
        let result = tokio::select! {
            r = async {
                match bound {
                    Some(t) => tokio::time::timeout(t, sent).await.ok(),
                    None => Some(sent.await),
                }
            } => r,
            () = call.activity.stalled(shared.settings.fairness.request_body_timeout) => {
                shared.balancer.finish(f, slot, None);
                return Some(Forwarded::answer(408, "request body timeout\n".into(), Flag::None, attempt));
            }
        };
        let outcome = match &result {
            Some(Ok(resp)) => Attempt::Status(resp.status().as_u16()),
            Some(Err(e)) if e.is_connect() => Attempt::ConnectFailure,
            Some(Err(_)) => Attempt::Reset,
            // A timed-out attempt is a 504, which 5xx and gateway-error retry.
            None => Attempt::Status(504),
        };
        let status = match (&result, outcome) {
            (Some(Ok(_)), Attempt::Status(s)) => Some(s),
            _ => None,
        };
        shared.balancer.finish(f, slot, status);
        let overall_left = balance::remaining(self.deadline).map_or(true, |r| !r.is_zero());
        if attempt <= self.retries && overall_left && self.route.retry.as_ref().is_some_and(|r| r.on.retries(outcome)) {
            tracing::debug!(upstream = %ep, ?outcome, attempt, "retrying on another endpoint");
            return None;
        }
        let (response, flag) = match result {
            Some(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                crate::headers::modify(&mut parts.headers, &self.filters.response_headers);
                (Response::from_parts(parts, body.boxed()), Flag::None)
            }
            Some(Err(e)) => {
                tracing::debug!(upstream = %ep, "upstream request failed: {e}");
                let flag = if e.is_connect() { Flag::UpstreamConnectFailure } else { Flag::UpstreamConnectionTermination };
                (text(503, format!("upstream connect error: {e}\n")), flag)
            }
            None if !overall_left || self.policy.per_try.is_none() => {
                (text(504, "upstream request timeout\n".into()), Flag::UpstreamRequestTimeout)
            }
            None => (text(504, "upstream request timeout (per try)\n".into()), Flag::UpstreamRequestTimeout),
        };
        Some(Forwarded { response, flag, upstream, attempts: attempt, denied_by: None })
    }
}
