//! What the waypoint does with one tunnel and one request, decided over
//! one mesh snapshot and the routes: pure, table-tested, no sockets.
//!
//! - [`target`]: whether a tunnel's `:authority` is something this
//!   waypoint serves (a service or a pod bound to it).
//! - [`decide`]: for one request to that target, the route rule, the
//!   backend and endpoint, or the answer the waypoint gives itself
//!   (redirect, 404, 500, 503).

use crate::flag::Flag;
use slipstream_core::route::traffic::{Fault, Retry, TrafficPolicy};
use slipstream_core::route::{pick_backend, rewrite_path, select, RequestView, RouteRule, ServiceRoutes, Subset};
use slipstream_core::{Destination, Endpoint, MeshService, MeshState, MeshWorkload};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Which waypoint this is: the Service its Gateway made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Me {
    pub namespace: String,
    /// Its Gateway's name: the workload API names it
    /// `<name>.<namespace>.svc.<the cluster's domain>`.
    pub name: String,
}

impl Me {
    /// `g` names this waypoint in force (port 0 marks a binding the
    /// control plane refused: its listener does not allow the namespace,
    /// or it does not take that kind of traffic).
    fn is(&self, g: Option<&slipstream_core::GatewayAddress>) -> bool {
        g.is_some_and(|g| g.namespace == self.namespace && self.named(&g.hostname) && g.hbone_mtls_port != 0)
    }

    /// `key` (`namespace/hostname`) names this waypoint's own routes: the
    /// policies it enforces on requests addressed to a pod bound to it.
    pub fn is_own_routes(&self, key: &str) -> bool {
        key.split_once('/').is_some_and(|(ns, host)| ns == self.namespace && self.named(host))
    }

    /// `hostname` is this waypoint's Service, in whatever domain the
    /// control plane serves (`--domain-suffix`, `cluster.local` by default).
    fn named(&self, hostname: &str) -> bool {
        hostname
            .strip_prefix(self.name.as_str())
            .and_then(|r| r.strip_prefix('.'))
            .and_then(|r| r.strip_prefix(self.namespace.as_str()))
            .and_then(|r| r.strip_prefix(".svc."))
            .is_some_and(|domain| !domain.is_empty())
    }
}

/// What a tunnel was opened for.
#[derive(Debug, Clone)]
pub enum Target {
    /// A service bound to this waypoint, on the port the client dialed.
    Service { service: Arc<MeshService>, port: u16 },
    /// A pod bound to this waypoint (waypoint-for workload or all).
    Workload { workload: Arc<MeshWorkload>, port: u16 },
}

impl Target {
    /// `namespace/hostname` of the service, or the pod's name, for logs.
    pub fn name(&self) -> String {
        match self {
            Target::Service { service, .. } => service.hostname().to_string(),
            Target::Workload { workload, .. } => format!("{}/{}", workload.namespace, workload.name),
        }
    }
}

/// Why a tunnel is refused: the waypoint serves only what is bound to it,
/// so a client cannot use it to reach anything else.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotServed {
    #[error("{0} is not a service or pod of the mesh")]
    Unknown(SocketAddr),
    #[error("{what} is not bound to this waypoint")]
    NotBound { what: String },
}

pub fn target(state: &MeshState, me: &Me, authority: SocketAddr) -> Result<Target, NotServed> {
    match state.destination(authority.ip()) {
        Destination::Service(s) if me.is(s.waypoint.as_ref()) => Ok(Target::Service { service: s, port: authority.port() }),
        Destination::Workload(w) if me.is(w.waypoint.as_ref()) => Ok(Target::Workload { workload: w, port: authority.port() }),
        Destination::Service(s) => Err(NotServed::NotBound { what: format!("service {}", s.hostname()) }),
        Destination::Workload(w) => Err(NotServed::NotBound { what: format!("pod {}/{}", w.namespace, w.name) }),
        Destination::Unknown => Err(NotServed::Unknown(authority)),
    }
}

/// How the waypoint takes a tunnel's bytes: by what the port is declared
/// as (`Port.app_protocol`: the Service port's `appProtocol`, or its
/// name's prefix), never by what the client chooses to send first, so a
/// client cannot turn an HTTP port into raw TCP around its routes and
/// policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// Declared HTTP, HTTP/2 or gRPC: served as HTTP (HTTP/1.1, or HTTP/2
    /// when the client starts with its preface) whatever comes; what does
    /// not parse as HTTP is answered 400 and logged. Never passed through.
    Http,
    /// Declared TCP or TLS: passed through, under the policies at L4 (an
    /// HTTP attribute fails closed).
    Tcp,
    /// Not declared: HTTP if the client starts with an HTTP request, else
    /// passed through as for `Tcp`.
    Sniff,
}

/// The handling of `target`'s port: a pod's port is declared by the
/// Services that select it (one of them declaring HTTP is enough).
pub fn handling(target: &Target) -> Handling {
    use slipstream_core::AppProtocol;
    let declared: Vec<AppProtocol> = match target {
        Target::Service { service, port } => service.ports.iter().filter(|p| p.service_port == *port).map(|p| p.app_protocol).collect(),
        Target::Workload { workload, port } => {
            workload.services.values().flatten().filter(|p| p.target_port == *port).map(|p| p.app_protocol).collect()
        }
    };
    if declared.iter().any(|p| p.is_http()) {
        Handling::Http
    } else if declared.iter().any(|p| matches!(p, AppProtocol::Tcp | AppProtocol::Tls)) {
        Handling::Tcp
    } else {
        Handling::Sniff
    }
}

/// One request as the decision sees it.
#[derive(Debug, Clone, Copy)]
pub struct Req<'a> {
    pub view: RequestView<'a>,
    /// The `Host` (HTTP/1.1) or `:authority` (HTTP/2), as sent.
    pub host: &'a str,
    /// A uniform random number: which backend.
    pub draw_backend: u64,
}

/// Where a request goes: the endpoints it may go to, and how one is
/// chosen and tried ([`crate::balance`] picks, [`crate::forward`] tries).
#[derive(Debug, Clone)]
pub struct Forward {
    /// The backend service (None: a pod addressed directly).
    pub service: Option<Arc<MeshService>>,
    /// The ready endpoints (of the subset, if the backend names one), in
    /// the mesh's order; never empty.
    pub candidates: Vec<Endpoint>,
    /// Where per-endpoint state (requests in flight, round robin,
    /// outlier ejections) is kept: the service key, `#subset` appended.
    pub pool: String,
    /// The backend's DestinationRule policy (its subset's, if it has one).
    pub traffic: TrafficPolicy,
    /// The path and query to send (after a URLRewrite).
    pub path_and_query: String,
    /// The `Host` to send (after a URLRewrite).
    pub host: Option<String>,
    /// The whole request, retries included (`timeouts.request`, Istio's
    /// `timeout`).
    pub timeout: Option<Duration>,
    /// One attempt (`timeouts.backendRequest`, Istio's `perTryTimeout`).
    pub attempt_timeout: Option<Duration>,
    pub retry: Option<Retry>,
    pub fault: Option<Fault>,
}

/// What the waypoint does with a request.
#[derive(Debug, Clone)]
pub enum Action {
    Forward(Box<Forward>),
    /// A RequestRedirect filter: status and `location`.
    Redirect {
        status: u16,
        location: String,
    },
    /// The waypoint answers itself: no rule matched (404), a rule whose
    /// backends are all invalid (500), no ready endpoint (503).
    Respond {
        status: u16,
        flag: Flag,
        detail: String,
    },
}

/// The decision and the rule that made it (for the access log).
#[derive(Debug, Clone)]
pub struct Decision<'r> {
    pub rule: Option<&'r RouteRule>,
    pub action: Action,
}

fn respond<'r>(rule: Option<&'r RouteRule>, status: u16, flag: Flag, detail: String) -> Decision<'r> {
    Decision { rule, action: Action::Respond { status, flag, detail } }
}

fn path_and_query(path: &str, query: &str) -> String {
    if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{query}")
    }
}

/// The waypoint's authorization of one request (or, `http` false, one
/// connection passed through as TCP) to `target`: the policies bound to
/// its service (`routes`), evaluated with Istio's semantics.
pub fn authorize(
    routes: Option<&ServiceRoutes>,
    target: &Target,
    caller: Caller,
    req: Option<(&RequestView, &str)>,
) -> slipstream_core::policy::l7::L7Verdict {
    let port = match target {
        Target::Service { port, .. } | Target::Workload { port, .. } => *port,
    };
    let policies = routes.map(|r| r.policies.as_slice()).unwrap_or(&[]);
    // A service's: those bound to it (the selector-bound ones are the
    // endpoint's, `authorize_endpoint`). A pod's (the waypoint's own
    // routes): the Gateway's, and its Services' restricted to it.
    let applies = |p: &&slipstream_core::policy::l7::L7Policy| {
        p.workloads.is_none()
            && match target {
                Target::Service { .. } => p.pods.is_none(),
                Target::Workload { workload, .. } => p.pods.as_ref().map_or(true, |uids| uids.binary_search(&workload.uid).is_ok()),
            }
    };
    evaluate_l7(policies.iter().filter(applies), port, caller, req)
}

/// Who a request or connection comes from, as the policies see it: the
/// verified peer, its address (`source.ip`), and how many proxies in front
/// of the mesh are trusted to have written `X-Forwarded-For` (MeshConfig's
/// `numTrustedProxies`, for `remote.ip`).
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    pub identity: &'a slipstream_core::SpiffeId,
    pub addr: std::net::IpAddr,
    pub trusted_proxies: u32,
    /// What the request's JWT established (RequestAuthentication).
    pub auth: Option<&'a slipstream_core::policy::l7::RequestAuth>,
}

/// The authorization of the workload a request (or TCP connection) is
/// about to be sent to: `policies`, the selector-bound policies of that
/// workload that its waypoint enforces (as its own node proxy or a sidecar
/// would, with the original client and the workload's `port`). None when
/// there are none.
pub fn authorize_endpoint(
    policies: &[slipstream_core::policy::l7::L7Policy],
    port: u16,
    caller: Caller,
    req: Option<(&RequestView, &str)>,
) -> Option<slipstream_core::policy::l7::L7Verdict> {
    (!policies.is_empty()).then(|| evaluate_l7(policies.iter(), port, caller, req))
}

fn evaluate_l7<'p>(
    policies: impl Iterator<Item = &'p slipstream_core::policy::l7::L7Policy> + Clone,
    port: u16,
    caller: Caller,
    req: Option<(&RequestView, &str)>,
) -> slipstream_core::policy::l7::L7Verdict {
    use slipstream_core::policy::l7::{evaluate, remote_ip, L7Request};
    let peer = caller.identity;
    let principal = peer.principal();
    let empty: [(&str, &str); 0] = [];
    let headers = req.map_or(&empty[..], |(v, _)| v.headers);
    let xff: Vec<&str> = headers.iter().filter(|(k, _)| *k == "x-forwarded-for").map(|(_, v)| *v).collect();
    let r = L7Request {
        principal: Some(principal),
        namespace: Some(peer.namespace()),
        source_ip: caller.addr,
        remote_ip: remote_ip(&xff, caller.addr, caller.trusted_proxies),
        method: req.map_or("", |(v, _)| v.method),
        path: req.map_or("", |(v, _)| v.path),
        host: req.map_or("", |(_, h)| h),
        port,
        headers,
        http: req.is_some(),
        auth: caller.auth,
    };
    evaluate(policies, &r)
}

/// Decides one request to `target`. A service with routes takes the first
/// matching rule (Gateway API: none matching is a 404); a service without
/// routes goes to its own endpoints on the dialed port; a pod is the
/// endpoint itself.
///
/// `traffic_of` gives a service's DestinationRule policy (by service key):
/// the backend's applies, not the target's.
pub fn decide<'r>(
    state: &MeshState,
    routes: Option<&'r ServiceRoutes>,
    traffic_of: &dyn Fn(&str) -> TrafficPolicy,
    target: &Target,
    req: &Req,
) -> Decision<'r> {
    let pq = path_and_query(req.view.path, req.view.query);
    let (service, port) = match target {
        Target::Workload { workload, port } => {
            let endpoint = Endpoint { workload: workload.clone(), target_port: *port };
            return Decision {
                rule: None,
                action: Action::Forward(Box::new(Forward {
                    service: None,
                    candidates: vec![endpoint],
                    pool: format!("{}/{}", workload.namespace, workload.name),
                    traffic: TrafficPolicy::default(),
                    path_and_query: pq,
                    host: None,
                    timeout: None,
                    attempt_timeout: None,
                    retry: None,
                    fault: None,
                })),
            };
        }
        Target::Service { service, port } => (service, *port),
    };
    let rules = routes.map(|r| r.rules.as_slice()).unwrap_or(&[]);
    let applies = rules.iter().any(|r| r.port == 0 || r.port == port);
    if !applies {
        let traffic = traffic_of(service.key());
        return to_service(state, None, service.clone(), port, None, traffic, pq, None);
    }
    let Some((rule, m)) = select(rules, port, &req.view) else {
        return respond(
            None,
            404,
            Flag::NoRoute,
            format!("no route of {} matches {} {}", service.hostname(), req.view.method, req.view.path),
        );
    };
    let matched = rule.matches.get(m).map(|m| &m.path).cloned().unwrap_or_default();
    let f = &rule.filters;
    if let Some(r) = &f.redirect {
        let scheme = r.scheme.as_deref().unwrap_or("http");
        let host = r.hostname.clone().unwrap_or_else(|| req.host.rsplit_once(':').map_or(req.host, |(h, _)| h).to_string());
        // Gateway API: no port given, the scheme's well-known port when a
        // scheme is given, else the port the request came to.
        let port = match (r.port.or(if r.scheme.is_some() { None } else { Some(port) }), scheme) {
            (Some(80), "http") | (Some(443), "https") | (None, _) => String::new(),
            (Some(p), _) => format!(":{p}"),
        };
        let path = r.path.as_ref().map_or_else(|| req.view.path.to_string(), |p| rewrite_path(&matched, p, req.view.path));
        return Decision {
            rule: Some(rule),
            action: Action::Redirect {
                status: r.status,
                location: format!("{scheme}://{host}{port}{}", path_and_query(&path, req.view.query)),
            },
        };
    }
    let Some(b) = pick_backend(&rule.backends, req.draw_backend) else {
        return respond(Some(rule), 500, Flag::NoRoute, format!("route {} has no valid backend", rule.name));
    };
    let Some(svc) = state.service(&b.service) else {
        return respond(Some(rule), 500, Flag::NoRoute, format!("route {}: backend {} does not exist", rule.name, b.service));
    };
    let (pq, host) = match &f.rewrite {
        Some(rw) => {
            let path = rw.path.as_ref().map_or_else(|| req.view.path.to_string(), |p| rewrite_path(&matched, p, req.view.path));
            (path_and_query(&path, req.view.query), rw.hostname.clone())
        }
        None => (pq, None),
    };
    // Port 0: neither the backendRef nor the parentRef named one, so the
    // port the client dialed.
    let backend_port = if b.port == 0 { port } else { b.port };
    let traffic = match b.subset.as_ref().and_then(|s| s.traffic.clone()) {
        Some(t) => t,
        None => traffic_of(&b.service),
    };
    to_service(state, Some(rule), svc, backend_port, b.subset.as_ref(), traffic, pq, host)
}

#[allow(clippy::too_many_arguments)]
fn to_service<'r>(
    state: &MeshState,
    rule: Option<&'r RouteRule>,
    service: Arc<MeshService>,
    port: u16,
    subset: Option<&Subset>,
    traffic: TrafficPolicy,
    path_and_query: String,
    host: Option<String>,
) -> Decision<'r> {
    let mut candidates = state.endpoints(&service, port);
    if let Some(s) = subset {
        candidates.retain(|e| s.workloads.binary_search(&e.workload.uid).is_ok());
    }
    if candidates.is_empty() {
        let of = subset.map(|s| format!("subset {} of ", s.name)).unwrap_or_default();
        return respond(
            rule,
            503,
            Flag::NoHealthyUpstream,
            format!("{of}service {} has no ready endpoint for port {port}", service.hostname()),
        );
    }
    let pool = match subset {
        Some(s) => format!("{}#{}", service.key(), s.name),
        None => service.key().to_string(),
    };
    let forward = Forward {
        service: Some(service),
        candidates,
        pool,
        traffic,
        path_and_query,
        host,
        timeout: rule.and_then(|r| r.timeout),
        attempt_timeout: rule.and_then(|r| r.backend_timeout.or(r.retry.as_ref().and_then(|t| t.per_try_timeout))),
        retry: rule.and_then(|r| r.retry.clone()),
        fault: rule.and_then(|r| r.fault.clone()),
    };
    Decision { rule, action: Action::Forward(Box::new(forward)) }
}

#[cfg(test)]
mod tests;
