//! The waypoint's routing model: Gateway API HTTPRoute rules compiled per
//! service by the control plane (`slipstream.route.v1.ServiceRoutes` on
//! the wire), and the pure decisions the waypoint makes with them: which
//! rule a request takes ([`select`]), which backend ([`pick_backend`]),
//! how its path is rewritten ([`rewrite_path`]). The control plane orders
//! the rules once with [`sort_rules`], so the waypoint only walks them.
//!
//! Only what Gateway API standard HTTPRoute says is modelled; what the
//! control plane refuses (RegularExpression matches, ExtensionRef filters,
//! session persistence, retries) has no representation here.

use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::time::Duration;

pub mod traffic;

/// Every rule that applies to one service, in precedence order: the first
/// rule that matches a request is the one it takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ServiceRoutes {
    /// `namespace/hostname`, the workload API's service key.
    pub service: String,
    pub rules: Vec<RouteRule>,
    /// The AuthorizationPolicies the waypoint enforces on this service's
    /// requests (bound to the Service or to the waypoint's Gateway).
    #[serde(default)]
    pub policies: Vec<crate::policy::l7::L7Policy>,
    /// The service's DestinationRule `trafficPolicy` (Istio's defaults
    /// when it has none).
    #[serde(default)]
    pub traffic: traffic::TrafficPolicy,
    /// Where the rules came from: `HTTPRoute`, `VirtualService` (which
    /// are walked in the order written) or empty (no routes).
    #[serde(default)]
    pub source: String,
    /// `LocalRateLimitPolicy`s on the service or on some of its rules.
    #[serde(default)]
    pub limits: Vec<RateLimit>,
    /// The JWT rules of the RequestAuthentications that target the service
    /// or its waypoint's Gateway: a request carrying a token they cannot
    /// validate is refused; a request without one is let through with no
    /// request identity (docs/authorization.md, "RequestAuthentication").
    #[serde(default)]
    pub jwt_rules: Vec<JwtRule>,
}

/// One `jwtRules` entry of a RequestAuthentication, as the waypoint
/// validates with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct JwtRule {
    /// `namespace/name` of its RequestAuthentication, for the access log.
    pub policy: String,
    /// The `iss` a token must carry; empty: any.
    pub issuer: String,
    /// A token must carry one of these in `aud`; empty: not checked.
    pub audiences: Vec<String>,
    /// The JWKS as JSON: inline in the policy, or as the control plane
    /// fetched it from `jwksUri`. Empty when it could not be fetched: then
    /// every token is refused (fail closed).
    pub jwks: String,
    /// Where the token is (`fromHeaders`, `fromParams`, `fromCookies`);
    /// all empty: `Authorization: Bearer <token>`, then the `access_token`
    /// query parameter.
    pub from_headers: Vec<JwtHeader>,
    pub from_params: Vec<String>,
    pub from_cookies: Vec<String>,
    /// A header (lower-case) that gets the payload, base64url-encoded JSON.
    pub output_payload_to_header: Option<String>,
    /// Keep the token in the request the app gets (only for headers).
    pub forward_original_token: bool,
    /// Claims copied into headers (lower-case header, claim path).
    pub output_claim_to_headers: Vec<(String, String)>,
    /// Claims (besides `scope` and `permission`) split at spaces.
    pub space_delimited_claims: Vec<String>,
}

/// A header a token is read from: its name (lower-case) and the prefix
/// the value must start with (`Bearer `).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct JwtHeader {
    pub name: String,
    pub prefix: String,
}

/// A `slipstream.io/v1alpha1` `LocalRateLimitPolicy` as it applies to one
/// service: a token bucket of `burst` tokens, `requests` added per
/// `interval`, per waypoint replica; a request finding it empty is
/// answered 429 with `retry-after`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    /// `namespace/name` of the policy.
    pub policy: String,
    pub requests: u32,
    pub interval: Duration,
    pub burst: u32,
    /// Which requests of the service take from the bucket.
    pub scope: LimitScope,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LimitScope {
    /// Every request to the service.
    Service,
    /// Requests that took one of these rules: a whole route is
    /// `namespace/route.` (every rule of it), one rule its full name
    /// (`namespace/route.0`, `namespace/vs.canary`).
    Rules { routes: Vec<String>, rules: Vec<String> },
}

impl RateLimit {
    /// Whether a request that took `rule` (None: no rule) draws on it.
    pub fn applies(&self, rule: Option<&str>) -> bool {
        match &self.scope {
            LimitScope::Service => true,
            LimitScope::Rules { routes, rules } => {
                rule.is_some_and(|r| rules.iter().any(|x| x == r) || routes.iter().any(|p| r.starts_with(p.as_str())))
            }
        }
    }
}

/// One HTTPRoute rule as it applies to one service. After [`sort_rules`]
/// it has one match (a rule of several matches becomes one entry per
/// match, each ranked on its own, as Gateway API ranks matches).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RouteRule {
    /// `<namespace>/<route name>.<rule index>`, for logs and metrics.
    pub name: String,
    /// The service port the rule applies to (the parentRef's `port`); 0:
    /// every port of the service.
    pub port: u16,
    /// Any one of them; empty: every request.
    #[serde(default)]
    pub matches: Vec<RouteMatch>,
    /// Where requests go, by weight. None with a weight above 0 (and no
    /// redirect): the request is answered 500, as Gateway API says for a
    /// rule without a valid backend.
    #[serde(default)]
    pub backends: Vec<Backend>,
    #[serde(default)]
    pub filters: Filters,
    /// `timeouts.request`: the whole request, retries included.
    #[serde(default)]
    pub timeout: Option<Duration>,
    /// `timeouts.backendRequest`: one attempt at a backend.
    #[serde(default)]
    pub backend_timeout: Option<Duration>,
    /// VirtualService `retries` (Istio's default when the route says
    /// nothing); None: one attempt (HTTPRoute).
    #[serde(default)]
    pub retry: Option<traffic::Retry>,
    /// VirtualService `fault`.
    #[serde(default)]
    pub fault: Option<traffic::Fault>,
}

/// All of its conditions hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RouteMatch {
    #[serde(default)]
    pub path: PathMatch,
    /// Exact values; names lower-case.
    #[serde(default)]
    pub headers: Vec<HeaderMatch>,
    /// Exact values; names as written (query names are case-sensitive).
    #[serde(default)]
    pub query: Vec<QueryMatch>,
    /// Case-sensitive, as HTTP methods are.
    #[serde(default)]
    pub method: Option<String>,
    /// VirtualService header matches by `prefix`; names lower-case.
    #[serde(default)]
    pub header_prefixes: Vec<HeaderMatch>,
    /// VirtualService query parameter matches by `prefix`.
    #[serde(default)]
    pub query_prefixes: Vec<QueryMatch>,
    /// VirtualService `ignoreUriCase`: the path compared without case.
    #[serde(default)]
    pub ignore_case: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PathMatch {
    Exact(String),
    /// Gateway API `PathPrefix`: whole path elements, a trailing `/`
    /// ignored: `/foo` takes `/foo`, `/foo/` and `/foo/bar`, not `/foobar`.
    Prefix(String),
    /// VirtualService `uri.prefix`: a plain string prefix, as Envoy's
    /// `prefix`: `/foo` takes `/foobar` too.
    StringPrefix(String),
}

impl Default for PathMatch {
    /// Gateway API's default: `PathPrefix` `/`, every path.
    fn default() -> Self {
        PathMatch::Prefix("/".into())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderMatch {
    /// Lower-case.
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryMatch {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backend {
    /// `namespace/hostname`, the workload API's service key.
    pub service: String,
    /// 0: the port the request was addressed to (a backendRef without a
    /// port under a parentRef without one).
    pub port: u16,
    /// Relative to the rule's other backends; 0 is never chosen.
    pub weight: u32,
    /// A DestinationRule subset (VirtualService `destination.subset`):
    /// only its endpoints are chosen.
    #[serde(default)]
    pub subset: Option<Subset>,
}

/// A DestinationRule subset, resolved by the control plane to the
/// workloads of the service whose labels it selects (so the waypoint needs
/// no pod labels), with the subset's own traffic policy if it has one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Subset {
    pub name: String,
    /// Workload UIDs, sorted.
    pub workloads: Vec<String>,
    #[serde(default)]
    pub traffic: Option<traffic::TrafficPolicy>,
}

/// The filters of a rule, by kind (Gateway API allows each at most once,
/// mirrors excepted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Filters {
    #[serde(default)]
    pub request_headers: HeaderModifier,
    #[serde(default)]
    pub response_headers: HeaderModifier,
    /// The waypoint answers the redirect itself; backends are not used.
    #[serde(default)]
    pub redirect: Option<Redirect>,
    #[serde(default)]
    pub rewrite: Option<Rewrite>,
    /// Each request is also sent to these, and their answers dropped;
    /// their weight is not used.
    #[serde(default)]
    pub mirrors: Vec<Backend>,
    /// The fraction of requests mirrored, per million (VirtualService
    /// `mirrorPercentage`); None: every request.
    #[serde(default)]
    pub mirror_per_million: Option<u32>,
}

/// Header names lower-case; `set` replaces, `add` appends, `remove` drops.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct HeaderModifier {
    #[serde(default)]
    pub set: Vec<(String, String)>,
    #[serde(default)]
    pub add: Vec<(String, String)>,
    #[serde(default)]
    pub remove: Vec<String>,
}

impl HeaderModifier {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }
}

/// `RequestRedirect`: what the `location` changes from the request's URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redirect {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathRewrite>,
    pub port: Option<u16>,
    /// 301 or 302.
    pub status: u16,
}

impl Default for Redirect {
    fn default() -> Self {
        Redirect { scheme: None, hostname: None, path: None, port: None, status: 302 }
    }
}

/// `URLRewrite`: what the request sent upstream changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Rewrite {
    /// The `host` / `:authority` sent upstream.
    pub hostname: Option<String>,
    pub path: Option<PathRewrite>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PathRewrite {
    ReplaceFullPath(String),
    /// Replaces the part of the path the rule's `PathPrefix` matched.
    ReplacePrefixMatch(String),
}

/// What matching reads of a request.
#[derive(Debug, Clone, Copy)]
pub struct RequestView<'a> {
    pub method: &'a str,
    /// Without the query.
    pub path: &'a str,
    /// Raw, without the `?`.
    pub query: &'a str,
    /// Names lower-case; a name may repeat.
    pub headers: &'a [(&'a str, &'a str)],
}

/// A prefix without its trailing `/` (`/` itself becomes empty, which
/// every path extends).
fn prefix_stem(prefix: &str) -> &str {
    prefix.strip_suffix('/').unwrap_or(prefix)
}

impl PathMatch {
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathMatch::Exact(p) => path == p,
            PathMatch::Prefix(p) => {
                let stem = prefix_stem(p);
                path.strip_prefix(stem).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            }
            PathMatch::StringPrefix(p) => path.starts_with(p.as_str()),
        }
    }

    /// As [`PathMatch::matches`], ASCII case ignored when `ignore_case`.
    pub fn matches_case(&self, path: &str, ignore_case: bool) -> bool {
        if !ignore_case {
            return self.matches(path);
        }
        let lower = |s: &str| s.to_ascii_lowercase();
        let m = match self {
            PathMatch::Exact(p) => PathMatch::Exact(lower(p)),
            PathMatch::Prefix(p) => PathMatch::Prefix(lower(p)),
            PathMatch::StringPrefix(p) => PathMatch::StringPrefix(lower(p)),
        };
        m.matches(&lower(path))
    }
}

impl RouteMatch {
    /// Path, method, every header and every query parameter match.
    ///
    /// A header that appears several times is compared as its values
    /// joined by `,` (as Envoy does, and as HTTP says repeated headers
    /// mean). A query parameter is compared by its first occurrence, raw:
    /// `key=value` pairs split on `&` and the first `=`, not
    /// percent-decoded, so `a%20b` does not match `a b`.
    pub fn matches(&self, req: &RequestView) -> bool {
        self.path.matches_case(req.path, self.ignore_case)
            && self.method.as_deref().is_none_or(|m| m == req.method)
            && self.headers.iter().all(|h| header_value(req.headers, &h.name).is_some_and(|v| v == h.value))
            && self.query.iter().all(|q| query_value(req.query, &q.name) == Some(q.value.as_str()))
            && self.header_prefixes.iter().all(|h| header_value(req.headers, &h.name).is_some_and(|v| v.starts_with(h.value.as_str())))
            && self.query_prefixes.iter().all(|q| query_value(req.query, &q.name).is_some_and(|v| v.starts_with(q.value.as_str())))
    }
}

fn header_value(headers: &[(&str, &str)], name: &str) -> Option<String> {
    let mut values = headers.iter().filter(|(n, _)| *n == name).map(|(_, v)| *v);
    let first = values.next()?;
    Some(values.fold(first.to_string(), |mut acc, v| {
        acc.push(',');
        acc.push_str(v);
        acc
    }))
}

fn query_value<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query.split('&').filter(|p| !p.is_empty()).find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then_some(v)
    })
}

/// The first rule, in the given order, for `port` (its port is 0 or
/// `port`) that matches the request, and the index of its match that did
/// (0 for a rule without matches, which takes every request).
pub fn select<'a>(rules: &'a [RouteRule], port: u16, req: &RequestView) -> Option<(&'a RouteRule, usize)> {
    rules.iter().filter(|r| r.port == 0 || r.port == port).find_map(|r| {
        if r.matches.is_empty() {
            return Some((r, 0));
        }
        r.matches.iter().position(|m| m.matches(req)).map(|i| (r, i))
    })
}

/// The backend for a uniformly random `draw`: each with a chance of its
/// weight over the sum. None when there are none or every weight is 0 (the
/// waypoint then answers 500).
pub fn pick_backend(backends: &[Backend], draw: u64) -> Option<&Backend> {
    let total: u64 = backends.iter().map(|b| u64::from(b.weight)).sum();
    if total == 0 {
        return None;
    }
    let mut at = draw % total;
    backends.iter().filter(|b| b.weight > 0).find(|b| {
        let w = u64::from(b.weight);
        if at < w {
            true
        } else {
            at -= w;
            false
        }
    })
}

/// The path after `rewrite`, for a request whose `path` the rule's
/// `matched` matched. `ReplacePrefixMatch` replaces the matched prefix as
/// Gateway API's table says: whole elements, trailing `/` of prefix and
/// replacement ignored, never an empty path (`/foo/bar` with prefix `/foo`
/// and replacement `/xyz` or `/xyz/` is `/xyz/bar`; `/foo` with
/// replacement `` is `/`). Under an `Exact` match (which the control plane
/// refuses with `ReplacePrefixMatch`) the whole path is the prefix.
pub fn rewrite_path(matched: &PathMatch, rewrite: &PathRewrite, path: &str) -> String {
    let replacement = match rewrite {
        PathRewrite::ReplaceFullPath(p) => return p.clone(),
        PathRewrite::ReplacePrefixMatch(r) => prefix_stem(r),
    };
    let rest = match matched {
        PathMatch::Exact(_) => "",
        PathMatch::Prefix(p) => path.strip_prefix(prefix_stem(p)).unwrap_or(path),
        // Istio's `rewrite.uri` under `uri.prefix`: the matched characters
        // replaced by the value as written (Envoy's `prefix_rewrite`).
        PathMatch::StringPrefix(p) => {
            let PathRewrite::ReplacePrefixMatch(r) = rewrite else { unreachable!("returned above") };
            let rest = path.get(p.len()..).unwrap_or("");
            let out = format!("{r}{rest}");
            return if out.is_empty() { "/".into() } else { out };
        }
    };
    let out = format!("{replacement}{rest}");
    if out.is_empty() {
        "/".into()
    } else {
        out
    }
}

/// Where a rule came from: Gateway API's tie-breaks between routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleOrigin {
    /// The route's `metadata.creationTimestamp` as Kubernetes writes it
    /// (RFC 3339, UTC, `Z`, whole seconds), so that text order is time
    /// order. None (a manifest never stored by an API server) sorts first,
    /// as the control plane's other oldest-wins choices do.
    pub creation: Option<String>,
    /// `namespace/name` of the route.
    pub route: String,
}

/// How specific a match is, most specific first, as Gateway API ranks
/// them: an `Exact` path, then the longest `PathPrefix` (trailing `/`
/// aside), then a method, then the most headers, then the most query
/// parameters.
fn specificity(m: Option<&RouteMatch>) -> (bool, Reverse<usize>, bool, Reverse<usize>, Reverse<usize>) {
    let default = RouteMatch::default();
    let m = m.unwrap_or(&default);
    let (exact, prefix_len) = match &m.path {
        PathMatch::Exact(p) => (true, p.len()),
        PathMatch::Prefix(p) => (false, prefix_stem(p).len()),
        PathMatch::StringPrefix(p) => (false, p.len()),
    };
    (!exact, Reverse(prefix_len), m.method.is_none(), Reverse(m.headers.len()), Reverse(m.query.len()))
}

/// The rules of every route for one service, in Gateway API precedence:
/// each match becomes its own entry (a copy of its rule with that one
/// match), because Gateway API ranks matches, not rules: a rule matching
/// `Exact /a` or `PathPrefix /` must not take `/b/c` ahead of another
/// rule's `PathPrefix /b`. Entries are ranked by their match's
/// specificity, then by the oldest route, then by `namespace/name`; what
/// is still tied (the same route) keeps the order given, so pass each
/// route's rules in the order it lists them. A rule without matches ranks
/// as `PathPrefix /`.
pub fn sort_rules(rules: impl IntoIterator<Item = (RouteRule, RuleOrigin)>) -> Vec<RouteRule> {
    let mut entries: Vec<(RouteRule, RuleOrigin)> = Vec::new();
    for (rule, origin) in rules {
        if rule.matches.len() <= 1 {
            entries.push((rule, origin));
            continue;
        }
        for m in &rule.matches {
            entries.push((RouteRule { matches: vec![m.clone()], ..rule.clone() }, origin.clone()));
        }
    }
    // Stable: ties within a route keep the route's own order.
    entries.sort_by(|(a, ao), (b, bo)| {
        specificity(a.matches.first())
            .cmp(&specificity(b.matches.first()))
            .then_with(|| ao.creation.cmp(&bo.creation))
            .then_with(|| ao.route.cmp(&bo.route))
    });
    entries.into_iter().map(|(r, _)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(method: &'a str, path: &'a str, query: &'a str, headers: &'a [(&'a str, &'a str)]) -> RequestView<'a> {
        RequestView { method, path, query, headers }
    }

    fn hdrs<'a>(kv: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        kv.to_vec()
    }

    fn prefix(p: &str) -> RouteMatch {
        RouteMatch { path: PathMatch::Prefix(p.into()), ..Default::default() }
    }

    fn exact(p: &str) -> RouteMatch {
        RouteMatch { path: PathMatch::Exact(p.into()), ..Default::default() }
    }

    fn rule(name: &str, port: u16, matches: Vec<RouteMatch>) -> RouteRule {
        RouteRule { name: name.into(), port, matches, ..Default::default() }
    }

    fn backend(service: &str, weight: u32) -> Backend {
        Backend { service: service.into(), port: 9080, weight, subset: None }
    }

    #[test]
    fn paths_match_by_whole_elements() {
        let cases = [
            (PathMatch::Prefix("/foo".into()), "/foo", true),
            (PathMatch::Prefix("/foo".into()), "/foo/", true),
            (PathMatch::Prefix("/foo".into()), "/foo/bar", true),
            (PathMatch::Prefix("/foo".into()), "/foobar", false),
            (PathMatch::Prefix("/foo".into()), "/fo", false),
            (PathMatch::Prefix("/foo".into()), "/Foo", false),
            (PathMatch::Prefix("/foo/".into()), "/foo", true),
            (PathMatch::Prefix("/foo/".into()), "/foo/bar", true),
            (PathMatch::Prefix("/foo/".into()), "/foobar", false),
            (PathMatch::Prefix("/".into()), "/", true),
            (PathMatch::Prefix("/".into()), "/anything/at/all", true),
            (PathMatch::Exact("/foo".into()), "/foo", true),
            (PathMatch::Exact("/foo".into()), "/foo/", false),
            (PathMatch::Exact("/foo".into()), "/foo/bar", false),
        ];
        for (m, path, want) in cases {
            assert_eq!(m.matches(path), want, "{m:?} against {path}");
        }
    }

    #[test]
    fn virtual_service_matches_are_string_prefixes_and_may_ignore_case() {
        let sp = |p: &str| PathMatch::StringPrefix(p.into());
        assert!(sp("/foo").matches("/foobar"));
        assert!(sp("/foo").matches("/foo/bar"));
        assert!(!sp("/foo").matches("/fo"));
        assert!(!sp("/foo").matches("/FOO"));
        assert!(sp("/foo").matches_case("/FOObar", true));
        assert!(PathMatch::Exact("/Api".into()).matches_case("/aPI", true));
        let m = RouteMatch {
            path: sp("/"),
            header_prefixes: vec![HeaderMatch { name: "end-user".into(), value: "jas".into() }],
            query_prefixes: vec![QueryMatch { name: "v".into(), value: "2".into() }],
            ..Default::default()
        };
        let h = hdrs(&[("end-user", "jason")]);
        assert!(m.matches(&req("GET", "/x", "v=2.1", &h)));
        assert!(!m.matches(&req("GET", "/x", "v=1", &h)));
        assert!(!m.matches(&req("GET", "/x", "v=2", &hdrs(&[("end-user", "ja")]))));
        assert!(!m.matches(&req("GET", "/x", "", &h)), "an absent parameter has no prefix");
        // rewrite.uri under uri.prefix: the characters matched, replaced as written.
        let rw = |m: &str, r: &str, p: &str| rewrite_path(&sp(m), &PathRewrite::ReplacePrefixMatch(r.into()), p);
        assert_eq!(rw("/foo", "/bar", "/foo/x"), "/bar/x");
        assert_eq!(rw("/foo", "/bar/", "/foo/x"), "/bar//x");
        assert_eq!(rw("/", "/v2/", "/ratings"), "/v2/ratings");
        assert_eq!(rw("/foo", "", "/foo"), "/");
    }

    #[test]
    fn matches_need_every_condition() {
        let m = RouteMatch {
            path: PathMatch::Prefix("/api".into()),
            headers: vec![HeaderMatch { name: "x-user".into(), value: "jason".into() }],
            query: vec![QueryMatch { name: "v".into(), value: "2".into() }],
            method: Some("GET".into()),
            ..Default::default()
        };
        let jason = hdrs(&[("x-user", "jason")]);
        let two = hdrs(&[("x-user", "jason"), ("x-user", "ann")]);
        let other = hdrs(&[("x-user", "ann")]);
        let none = hdrs(&[]);
        let cases = [
            ("all hold", req("GET", "/api/x", "v=2", &jason), true),
            ("among other parameters", req("GET", "/api", "a=1&v=2&b", &jason), true),
            ("first occurrence of a parameter counts", req("GET", "/api", "v=1&v=2", &jason), false),
            ("wrong method", req("POST", "/api/x", "v=2", &jason), false),
            ("methods are case-sensitive", req("get", "/api/x", "v=2", &jason), false),
            ("wrong path", req("GET", "/apix", "v=2", &jason), false),
            ("wrong header value", req("GET", "/api", "v=2", &other), false),
            ("header missing", req("GET", "/api", "v=2", &none), false),
            ("repeated header compared joined", req("GET", "/api", "v=2", &two), false),
            ("parameter missing", req("GET", "/api", "w=2", &jason), false),
            ("parameter without value", req("GET", "/api", "v", &jason), false),
            ("raw, not decoded", req("GET", "/api", "v=%32", &jason), false),
        ];
        for (why, r, want) in cases {
            assert_eq!(m.matches(&r), want, "{why}");
        }
        let joined = RouteMatch { headers: vec![HeaderMatch { name: "x-user".into(), value: "jason,ann".into() }], ..Default::default() };
        assert!(joined.matches(&req("GET", "/", "", &two)));
        let empty_value = RouteMatch { query: vec![QueryMatch { name: "flag".into(), value: String::new() }], ..Default::default() };
        assert!(empty_value.matches(&req("GET", "/", "flag", &none)));
        assert!(empty_value.matches(&req("GET", "/", "x=1&flag=", &none)));
        assert!(RouteMatch::default().matches(&req("DELETE", "/whatever", "", &none)), "the default match takes everything");
    }

    #[test]
    fn select_takes_the_first_rule_for_the_port_that_matches() {
        let rules = vec![
            rule("a", 8080, vec![prefix("/")]),
            rule("b", 0, vec![exact("/x"), prefix("/api")]),
            rule("c", 9080, vec![prefix("/api/v2")]),
            rule("d", 0, vec![]),
        ];
        let none = hdrs(&[]);
        let cases = [
            (8080, "/api", Some(("a", 0))),
            (9080, "/x", Some(("b", 0))),
            (9080, "/api/v2", Some(("b", 1))),
            (9080, "/other", Some(("d", 0))),
            (7000, "/api/v2", Some(("b", 1))),
        ];
        for (port, path, want) in cases {
            let got = select(&rules, port, &req("GET", path, "", &none)).map(|(r, i)| (r.name.as_str(), i));
            assert_eq!(got, want, "{port} {path}");
        }
        assert_eq!(select(&rules[..3], 9090, &req("GET", "/zzz", "", &none)), None);
        assert_eq!(select(&[], 80, &req("GET", "/", "", &none)), None);
    }

    #[test]
    fn weighted_backends() {
        let bs = vec![backend("v1", 90), backend("off", 0), backend("v2", 10)];
        let pick = |d| pick_backend(&bs, d).map(|b| b.service.as_str());
        assert_eq!(pick(0), Some("v1"));
        assert_eq!(pick(89), Some("v1"));
        assert_eq!(pick(90), Some("v2"));
        assert_eq!(pick(99), Some("v2"));
        assert_eq!(pick(100), Some("v1"), "the draw wraps");
        let mut counts = [0u32; 2];
        for d in 0..1000u64 {
            match pick(d.wrapping_mul(0x9E37_79B9_7F4A_7C15)) {
                Some("v1") => counts[0] += 1,
                Some("v2") => counts[1] += 1,
                other => panic!("{other:?}"),
            }
        }
        assert!((850..950).contains(&counts[0]), "{counts:?}");
        assert_eq!(pick_backend(&[backend("off", 0)], 7), None);
        assert_eq!(pick_backend(&[], 7), None);
        assert_eq!(pick_backend(&[backend("only", 1)], u64::MAX).map(|b| b.weight), Some(1));
        let big = [backend("a", u32::MAX), backend("b", u32::MAX)];
        assert_eq!(pick_backend(&big, u64::from(u32::MAX)).map(|b| b.service.as_str()), Some("b"));
    }

    #[test]
    fn path_rewrites_follow_the_gateway_api_table() {
        let pre = |r: &str| PathRewrite::ReplacePrefixMatch(r.into());
        let p = |s: &str| PathMatch::Prefix(s.into());
        // Gateway API's HTTPPathModifier table, row by row.
        let cases = [
            ("/foo/bar", "/foo", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo", "/xyz/", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz", "/xyz/bar"),
            ("/foo/bar", "/foo/", "/xyz/", "/xyz/bar"),
            ("/foo", "/foo", "/xyz", "/xyz"),
            ("/foo/", "/foo", "/xyz", "/xyz/"),
            ("/foo/bar", "/foo", "", "/bar"),
            ("/foo/", "/foo", "", "/"),
            ("/foo", "/foo", "", "/"),
            ("/foo/", "/foo", "/", "/"),
            ("/foo", "/foo", "/", "/"),
            ("/a/b", "/", "/x", "/x/a/b"),
            ("/", "/", "/x", "/x/"),
        ];
        for (path, matched, replacement, want) in cases {
            assert_eq!(rewrite_path(&p(matched), &pre(replacement), path), want, "{path} {matched} {replacement}");
        }
        assert_eq!(rewrite_path(&p("/foo"), &PathRewrite::ReplaceFullPath("/full".into()), "/foo/bar"), "/full");
        assert_eq!(rewrite_path(&PathMatch::Exact("/foo".into()), &pre("/bar"), "/foo"), "/bar");
    }

    #[test]
    fn precedence_ranks_matches_across_routes() {
        let origin = |created: Option<&str>, route: &str| RuleOrigin { creation: created.map(str::to_string), route: route.into() };
        let old = Some("2024-01-01T00:00:00Z");
        let new = Some("2024-06-01T00:00:00Z");
        let with = |m: RouteMatch, f: &dyn Fn(&mut RouteMatch)| {
            let mut m = m;
            f(&mut m);
            m
        };
        let h = |n: &str| HeaderMatch { name: n.into(), value: "1".into() };
        let q = |n: &str| QueryMatch { name: n.into(), value: "1".into() };
        let input = vec![
            (rule("new/catchall.0", 0, vec![]), origin(new, "ns/new")),
            (rule("new/mixed.0", 0, vec![exact("/a"), prefix("/")]), origin(new, "ns/new")),
            (rule("new/b.1", 0, vec![prefix("/b")]), origin(new, "ns/new")),
            (rule("old/b.0", 0, vec![prefix("/b/")]), origin(old, "ns/old")),
            (rule("zeta/b.0", 0, vec![prefix("/b")]), origin(old, "ns/zeta")),
            (rule("alpha/b.0", 0, vec![prefix("/b")]), origin(old, "ns/alpha")),
            (rule("old/long.0", 0, vec![prefix("/b/c")]), origin(new, "ns/old")),
            (rule("old/get.0", 0, vec![with(prefix("/b"), &|m| m.method = Some("GET".into()))]), origin(new, "ns/old")),
            (rule("old/h1.0", 0, vec![with(prefix("/b"), &|m| m.headers = vec![h("a")])]), origin(new, "ns/old")),
            (rule("old/h2.0", 0, vec![with(prefix("/b"), &|m| m.headers = vec![h("a"), h("b")])]), origin(new, "ns/old")),
            (rule("old/q1.0", 0, vec![with(prefix("/b"), &|m| m.query = vec![q("a")])]), origin(new, "ns/old")),
            (
                rule(
                    "old/h1q1.0",
                    0,
                    vec![with(prefix("/b"), &|m| {
                        m.headers = vec![h("a")];
                        m.query = vec![q("a")]
                    })],
                ),
                origin(new, "ns/old"),
            ),
            (rule("unstored.0", 0, vec![prefix("/b")]), origin(None, "ns/unstored")),
            (rule("old/exact.0", 0, vec![exact("/b/c/d/e/f")]), origin(new, "ns/old")),
        ];
        let sorted = sort_rules(input);
        let names: Vec<(&str, String)> = sorted
            .iter()
            .map(|r| {
                assert_eq!(r.matches.len().min(1), r.matches.len(), "at most one match per entry");
                let p = match r.matches.first().map(|m| &m.path) {
                    Some(PathMatch::Exact(p)) => format!("={p}"),
                    Some(PathMatch::Prefix(p)) | Some(PathMatch::StringPrefix(p)) => p.clone(),
                    None => "(none)".into(),
                };
                (r.name.as_str(), p)
            })
            .collect();
        let want = [
            ("old/exact.0", "=/b/c/d/e/f"),
            ("new/mixed.0", "=/a"),
            ("old/long.0", "/b/c"),
            ("old/get.0", "/b"),
            ("old/h2.0", "/b"),
            ("old/h1q1.0", "/b"),
            ("old/h1.0", "/b"),
            ("old/q1.0", "/b"),
            ("unstored.0", "/b"),
            ("alpha/b.0", "/b"),
            ("old/b.0", "/b/"),
            ("zeta/b.0", "/b"),
            ("new/b.1", "/b"),
            ("new/catchall.0", "(none)"),
            ("new/mixed.0", "/"),
        ];
        let want: Vec<(&str, String)> = want.iter().map(|(n, p)| (*n, p.to_string())).collect();
        assert_eq!(names, want);

        // The reason for one entry per match: `/b/x` goes to the rule of
        // `PathPrefix /b`, not to the rule that also matches `Exact /a`.
        let none = hdrs(&[]);
        let got = select(&sorted, 80, &req("GET", "/b/x", "", &none)).map(|(r, _)| r.name.as_str());
        assert_eq!(got, Some("old/get.0"));
        let got = select(&sorted, 80, &req("POST", "/b/x", "", &none)).map(|(r, _)| r.name.as_str());
        assert_eq!(got, Some("unstored.0"));
    }

    #[test]
    fn ties_within_a_route_keep_its_order() {
        let o = RuleOrigin { creation: None, route: "ns/r".into() };
        let sorted = sort_rules(vec![
            (rule("ns/r.0", 0, vec![prefix("/")]), o.clone()),
            (rule("ns/r.1", 0, vec![prefix("/")]), o.clone()),
            (rule("ns/r.2", 8080, vec![prefix("/")]), o),
        ]);
        let names: Vec<&str> = sorted.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["ns/r.0", "ns/r.1", "ns/r.2"]);
    }
}
