//! One request's decision, whole, before a byte of it is sent: what the
//! checks that read no route say (the path, the token, the service's
//! authorization), the route ([`crate::plan::decide`]), the rate limit,
//! and, for a request that goes on, how it is tried: retries, the attempt
//! and overall timeouts, whether it is mirrored, the fault drawn for it.
//! Plain data, table-tested; [`crate::forward`] carries a forwarded one
//! out and [`crate::proxy`] answers the rest.

use crate::flag::Flag;
use crate::jwt::JwtError;
use crate::plan::{self, Action};
use slipstream_core::path::PathError;
use slipstream_core::policy::l7::L7Verdict;
use slipstream_core::route::traffic::chance;
use slipstream_core::route::RouteRule;
use std::time::Duration;

/// What the waypoint decided for one request.
#[derive(Debug, Clone)]
pub struct Decision<'r> {
    /// The route rule that matched (the access log's `route`).
    pub rule: Option<&'r RouteRule>,
    /// The policy the access log names: the AuthorizationPolicy that
    /// decided, the RequestAuthentication that refused the token, or the
    /// LocalRateLimitPolicy that limited the request.
    pub policy: Option<String>,
    pub then: Then,
}

/// What is done with the request.
#[derive(Debug, Clone)]
pub enum Then {
    /// Answered here, for that reason.
    Refuse(Refusal),
    /// A RequestRedirect filter: status and `location`.
    Redirect { status: u16, location: String },
    /// Sent to the backend's endpoints, tried as [`Attempts`] says.
    Forward(Forwarding),
}

/// Why the waypoint answers a request itself, in the order it checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The path cannot be normalized as MeshConfig says: 400.
    Path(PathError),
    /// RequestAuthentication refused the token: 401, or 403 for its
    /// audience.
    Jwt(JwtError),
    /// The service's AuthorizationPolicies deny it: 403.
    Denied,
    /// A LocalRateLimitPolicy's bucket is empty: 429, with when to come
    /// back.
    RateLimited { wait: Duration },
    /// The route decision answers itself: no rule matched (404), no valid
    /// backend (500), no ready endpoint (503).
    Route { status: u16, flag: Flag, detail: String },
}

impl Refusal {
    pub fn status(&self) -> u16 {
        match self {
            Refusal::Path(_) => 400,
            Refusal::Jwt(e) => e.status(),
            Refusal::Denied => 403,
            Refusal::RateLimited { .. } => 429,
            Refusal::Route { status, .. } => *status,
        }
    }

    pub fn flag(&self) -> Flag {
        match self {
            Refusal::Path(_) => Flag::DownstreamProtocolError,
            Refusal::Jwt(_) => Flag::None,
            Refusal::Denied => Flag::Rbac,
            Refusal::RateLimited { .. } => Flag::RateLimited,
            Refusal::Route { flag, .. } => *flag,
        }
    }

    /// The answer's text.
    pub fn body(&self) -> String {
        match self {
            Refusal::Path(e) => format!("path refused: {e}\n"),
            Refusal::Jwt(e) => format!("{e}\n"),
            Refusal::Denied => "RBAC: access denied\n".into(),
            Refusal::RateLimited { .. } => "local_rate_limited\n".into(),
            Refusal::Route { detail, .. } => format!("{detail}\n"),
        }
    }

    /// `retry-after`, in whole seconds (at least 1), for a rate limit.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Refusal::RateLimited { wait } => Some((wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)),
            _ => None,
        }
    }
}

/// A forwarded request: where it may go, and how it is tried.
#[derive(Debug, Clone)]
pub struct Forwarding {
    /// The route's forwarding, in the box [`plan::decide`] made it in.
    pub route: Box<plan::Forward>,
    pub attempts: Attempts,
}

/// How a forwarded request is tried, its draws made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempts {
    /// Attempts after the first (0: none), each to another endpoint.
    pub retries: u32,
    /// One attempt's bound.
    pub per_try: Option<Duration>,
    /// The whole request's, retries included.
    pub overall: Option<Duration>,
    /// A copy goes to the rule's mirrors.
    pub mirror: bool,
    /// The fault rule's delay, drawn for this request.
    pub delay: Option<Duration>,
    /// The fault rule's abort status, drawn for this request.
    pub abort: Option<u16>,
}

/// What the checks before any route found.
#[derive(Debug, Clone, Copy)]
pub struct Checks<'a> {
    /// Why the path cannot be normalized, if it cannot.
    pub path: Option<PathError>,
    /// Why RequestAuthentication refused the token, if it did.
    pub jwt: Option<&'a JwtError>,
    /// The service's authorization.
    pub authz: &'a L7Verdict,
}

/// The uniform random numbers the decision draws with: whether this
/// request is mirrored, delayed, aborted.
#[derive(Debug, Clone, Copy, Default)]
pub struct Draws {
    pub mirror: u64,
    pub delay: u64,
    pub abort: u64,
}

impl Draws {
    pub fn random() -> Draws {
        Draws { mirror: rand::random(), delay: rand::random(), abort: rand::random() }
    }
}

/// A rate limit's refusal: the policy, and when it has a token again.
pub type Limited = (String, Duration);

/// Decides one request. The checks come first (a denied request learns
/// nothing of the routes); `route` is asked only for an allowed one, and
/// `limit` (LocalRateLimitPolicy: it takes a token) only for a request the
/// waypoint would route, not one it answers itself (404, 503 without
/// endpoints).
pub fn decide<'r>(
    checks: Checks<'_>,
    route: impl FnOnce() -> plan::Decision<'r>,
    limit: impl FnOnce(Option<&str>) -> Result<(), Limited>,
    draws: impl FnOnce() -> Draws,
) -> Decision<'r> {
    let by = checks.authz.by.as_ref().map(|b| format!("{}/{}", b.namespace, b.name));
    let refuse = |policy, r| Decision { rule: None, policy, then: Then::Refuse(r) };
    if let Some(e) = checks.path {
        return refuse(by, Refusal::Path(e));
    }
    if let Some(e) = checks.jwt {
        return refuse(Some(e.policy().to_string()), Refusal::Jwt(e.clone()));
    }
    if !checks.authz.allowed {
        return refuse(by, Refusal::Denied);
    }
    let plan::Decision { rule, action } = route();
    if let Action::Forward(_) | Action::Redirect { .. } = action {
        if let Err((policy, wait)) = limit(rule.map(|r| r.name.as_str())) {
            return Decision { rule, policy: Some(policy), then: Then::Refuse(Refusal::RateLimited { wait }) };
        }
    }
    let then = match action {
        Action::Respond { status, flag, detail } => Then::Refuse(Refusal::Route { status, flag, detail }),
        Action::Redirect { status, location } => Then::Redirect { status, location },
        Action::Forward(f) => {
            // Drawn only for a request that has something to draw for (a
            // fault, a mirror): not on every request.
            let wants = f.fault.is_some() || rule.is_some_and(|r| !r.filters.mirrors.is_empty());
            let attempts = attempts(&f, rule, if wants { draws() } else { Draws::default() });
            Then::Forward(Forwarding { route: f, attempts })
        }
    };
    Decision { rule, policy: by, then }
}

/// How `f` is tried under `rule`, with this request's draws.
fn attempts(f: &plan::Forward, rule: Option<&RouteRule>, draws: Draws) -> Attempts {
    let fault = f.fault.as_ref();
    let mirror =
        rule.is_some_and(|r| !r.filters.mirrors.is_empty() && r.filters.mirror_per_million.map_or(true, |p| chance(p, draws.mirror)));
    Attempts {
        retries: f.retry.as_ref().map_or(0, |r| r.attempts),
        per_try: f.attempt_timeout,
        overall: f.timeout,
        mirror,
        delay: fault.and_then(|x| x.delay.as_ref()).filter(|d| chance(d.per_million, draws.delay)).map(|d| d.delay),
        abort: fault.and_then(|x| x.abort.as_ref()).filter(|a| chance(a.per_million, draws.abort)).map(|a| a.status),
    }
}

#[cfg(test)]
mod tests;
