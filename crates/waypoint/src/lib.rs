//! slipstream-waypoint: the shared L7 proxy of the services (and pods)
//! bound to a Gateway of class `istio-waypoint` (docs/waypoint.md).
//!
//! A node proxy sends a bound destination's connections here over HBONE,
//! with the original destination as `:authority`. The waypoint
//! terminates the tunnel (verifying the caller's identity), serves HTTP on
//! it, and per request: picks the route rule ([`plan`]), the backend and
//! the endpoint, and sends the request to that endpoint's node proxy over
//! an HBONE tunnel of its own ([`upstream`]). Decisions are pure
//! ([`plan`] for the route, [`decision`] for the whole request);
//! [`handler`], [`proxy`] and [`forward`] do the I/O.
//!
//! It stands beside the node proxy, not on it: what the two share (the
//! control plane's channel, delta xDS and certificate clients, per-source
//! limits, the authorization seam, metric label types, process set-up) is
//! `slipstream_proxy`; it links neither `slipstream-node` nor the eBPF
//! datapath (`crates/cli/tests/structure.rs` checks it).
#![forbid(unsafe_code)]

pub mod accesslog;
pub mod balance;
pub mod body;
pub mod call;
pub mod client;
pub mod decision;
pub mod endpoint;
pub mod fair;
pub mod flag;
pub mod forward;
pub mod handler;
pub mod headers;
pub mod jwt;
pub mod logbuf;
pub mod metrics;
pub mod peer;
pub mod plan;
pub mod proxy;
pub mod replay;
pub mod run;
pub mod sniff;
pub mod tcp;
pub mod trace;
pub mod upstream;

use arc_swap::ArcSwap;
use slipstream_core::route::ServiceRoutes;
use slipstream_core::sync::LockExt;
use slipstream_core::{MeshState, SpiffeId};
use slipstream_hbone::Pool;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// Who this waypoint is.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Its Gateway's namespace and name.
    pub namespace: String,
    pub name: String,
    /// Its pod's address: the source address of its tunnels.
    pub own_ip: IpAddr,
    /// `spiffe://<td>/ns/<namespace>/sa/<name>`: the identity it presents
    /// to callers and to endpoints.
    pub identity: SpiffeId,
    /// Idle upstream HTTP connections are closed after this long.
    pub idle_timeout: Duration,
    /// What one client may hold of the waypoint (docs/waypoint.md,
    /// "Fairness").
    pub fairness: fair::Fairness,
}

/// Routes by service key (`namespace/hostname`).
pub type Routes = HashMap<String, Arc<ServiceRoutes>>;

/// What every tunnel and request of the waypoint shares.
pub struct Shared {
    pub settings: Settings,
    me: plan::Me,
    mesh: Arc<ArcSwap<MeshState>>,
    routes: ArcSwap<Routes>,
    /// The mesh-wide settings (MeshConfig), Istio's defaults until the
    /// control plane sends them.
    settings_mesh: ArcSwap<slipstream_core::mesh::MeshSettings>,
    /// The JWT rules of each routes resource (by its service key), their
    /// keys parsed once per update.
    jwt_rules: ArcSwap<HashMap<String, Arc<Vec<Arc<jwt::Prepared>>>>>,
    /// Its own routes (`plan::Me::is_own_routes`), found once per update.
    own_routes: arc_swap::ArcSwapOption<ServiceRoutes>,
    /// HTTP to endpoints, pooled per endpoint: HTTP/2 (prior knowledge)
    /// for requests that came as HTTP/2 (gRPC among them), else HTTP/1.1;
    /// the upstream speaks what the client spoke to the service.
    client: client::Clients,
    /// What the client uses, for TCP passed through.
    connector: upstream::Connector,
    /// Per-peer bounds on connections and handshakes, and the process's
    /// descriptor budget: the node proxy's limiter, so one pod cannot hold
    /// the waypoint that every bound service shares.
    limits: slipstream_proxy::limits::NodeLimits,
    /// The log lines of refused streams, at most a few per peer per 10 s.
    refusals: slipstream_proxy::limits::RefusalLog<std::net::IpAddr>,
    /// Requests in flight, round robin and outlier state, per pool.
    balancer: balance::Balancer,
    pub metrics: Arc<metrics::Metrics>,
    /// The selector-bound policies of each workload (by UID) whose waypoint
    /// this is, from every service's routes: the same whether the workload
    /// is reached through a service or by its own address.
    workload_policies: ArcSwap<HashMap<String, Vec<slipstream_core::policy::l7::L7Policy>>>,
    /// Request bodies held to be replayed (retries, mirrors), in KiB.
    replay_budget: Arc<tokio::sync::Semaphore>,
    /// Each client's part of it, in KiB.
    replay_shares: Arc<fair::Shares>,
    /// Each client's mirrored copies in flight.
    mirror_shares: Arc<fair::Shares>,
    /// Clients cooling down after connections they broke on purpose.
    strikes: fair::Strikes,
    /// Token buckets of the LocalRateLimitPolicies, by (policy, service).
    buckets: std::sync::Mutex<HashMap<(String, String), slipstream_core::bucket::TokenBucket>>,
    /// The graceful stop (docs/waypoint.md, "Restarts"): the drain the
    /// node proxy uses too. Closing: every HTTP/1 answer says
    /// `connection: close` and HTTP/2 clients get GOAWAY, so callers move
    /// to another replica between requests; Closed: the listener and idle
    /// connections closed, what is in flight finishes. Each tunnel watches
    /// it, and the drain waits for them.
    drain: slipstream_hbone::drain::DrainTrigger,
    /// Bumped at every configuration change: connections passed through
    /// as TCP are decided again (a policy change may deny them now).
    generation: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    /// The routes and policies of the service a tunnel is for.
    /// A pod addressed directly is under the waypoint's own routes (its
    /// Gateway's policies, and the bound Services' policies restricted to
    /// their pods: `plan::authorize`).
    fn routes_of(&self, target: &plan::Target) -> Option<Arc<ServiceRoutes>> {
        match target {
            plan::Target::Service { service, .. } => self.routes.load().get(service.key()).cloned(),
            plan::Target::Workload { .. } => self.own_routes.load_full(),
        }
    }

    /// Takes a token from every bucket that a request to `routes`' service
    /// that took `rule` draws on; or the policy of an empty one and when
    /// it has a token again.
    fn rate_limit(&self, routes: &ServiceRoutes, rule: Option<&str>) -> Result<(), (String, Duration)> {
        let now = std::time::Instant::now();
        let mut buckets = self.buckets.locked();
        for l in routes.limits.iter().filter(|l| l.applies(rule)) {
            let rate = slipstream_core::bucket::Rate::per(l.requests, l.interval, l.burst);
            let b = buckets
                .entry((l.policy.clone(), routes.service.clone()))
                .or_insert_with(|| slipstream_core::bucket::TokenBucket::full(rate, now));
            // A bucket that never refills (no requests per interval) is
            // tried again after one interval.
            b.take(rate, now).map_err(|wait| (l.policy.clone(), if wait == Duration::MAX { l.interval } else { wait }))?;
        }
        Ok(())
    }

    /// The caller of `peer`'s requests, as the policies see it.
    fn caller<'a>(&self, peer: &'a peer::Peer) -> plan::Caller<'a> {
        plan::Caller {
            identity: &peer.identity,
            addr: peer.addr.ip(),
            trusted_proxies: self.settings_mesh.load().num_trusted_proxies,
            auth: None,
        }
    }

    /// The JWT rules that apply to requests under `routes`.
    fn jwt_rules_of(&self, routes: &ServiceRoutes) -> Option<Arc<Vec<Arc<jwt::Prepared>>>> {
        self.jwt_rules.load().get(&routes.service).cloned()
    }

    /// A service's DestinationRule policy (Istio's defaults without one).
    fn traffic_of(&self, service: &str) -> slipstream_core::route::traffic::TrafficPolicy {
        self.routes.load().get(service).map(|r| r.traffic.clone()).unwrap_or_default()
    }
}

/// The waypoint: configuration in ([`Waypoint::set_mesh`],
/// [`Waypoint::set_routes`]), an HBONE [`handler`] out.
#[derive(Clone)]
pub struct Waypoint {
    shared: Arc<Shared>,
}

impl Waypoint {
    /// `pool` opens its tunnels to endpoints (with its own certificate).
    pub fn new(settings: Settings, pool: Pool) -> Waypoint {
        let mesh: Arc<ArcSwap<MeshState>> = Arc::new(ArcSwap::from_pointee(MeshState::default()));
        let connector =
            upstream::Connector { pool, identity: Arc::new(settings.identity.clone()), own_ip: settings.own_ip, mesh: mesh.clone() };
        let client = client::Clients::new(connector.clone(), settings.idle_timeout);
        let me = plan::Me { namespace: settings.namespace.clone(), name: settings.name.clone() };
        // The node proxy's derivation from the open-files limit, with its
        // per-peer defaults.
        let open_files = slipstream_proxy::sys::rlimit::current().map(|l| l.soft).unwrap_or(1024);
        let limits = slipstream_proxy::limits::NodeLimits::new(&slipstream_proxy::config::Limits::derive(
            open_files,
            &slipstream_proxy::config::LimitArgs { peer_streams: settings.fairness.client_streams, ..Default::default() },
        ));
        let replay_shares = fair::Shares::new(settings.fairness.client_replay_kib);
        let mirror_shares = fair::Shares::new(settings.fairness.client_mirrors);
        let strikes = fair::Strikes::new(&settings.fairness);
        Waypoint {
            shared: Arc::new(Shared {
                settings,
                me,
                mesh,
                routes: ArcSwap::from_pointee(Routes::new()),
                own_routes: arc_swap::ArcSwapOption::empty(),
                jwt_rules: ArcSwap::from_pointee(HashMap::new()),
                settings_mesh: ArcSwap::from_pointee(Default::default()),
                client,
                connector,
                limits,
                refusals: slipstream_proxy::limits::RefusalLog::new(5, std::time::Duration::from_secs(10)),
                balancer: balance::Balancer::default(),
                metrics: Arc::default(),
                buckets: Default::default(),
                replay_budget: Arc::new(tokio::sync::Semaphore::new(fair::REPLAY_BUDGET_KIB)),
                replay_shares,
                mirror_shares,
                strikes,
                workload_policies: ArcSwap::from_pointee(HashMap::new()),
                drain: slipstream_hbone::drain::DrainTrigger::new(),
                generation: tokio::sync::watch::Sender::new(0),
            }),
        }
    }

    pub fn set_mesh(&self, state: Arc<MeshState>) {
        self.shared.mesh.store(state);
        self.shared.generation.send_modify(|g| *g += 1);
    }

    /// The mesh-wide settings (MeshConfig): how paths are normalized, how
    /// much of `X-Forwarded-For` is trusted. Requests already in flight
    /// keep what they were decided with.
    pub fn set_settings(&self, settings: slipstream_core::mesh::MeshSettings) {
        self.shared.settings_mesh.store(Arc::new(settings));
    }

    pub fn set_routes(&self, routes: impl IntoIterator<Item = ServiceRoutes>) {
        let map: Routes = routes.into_iter().map(|r| (r.service.clone(), Arc::new(r))).collect();
        // Buckets of policies that no longer apply are dropped (bounded by
        // the configuration, not by traffic).
        let live: std::collections::HashSet<(&str, &str)> =
            map.values().flat_map(|r| r.limits.iter().map(move |l| (l.policy.as_str(), r.service.as_str()))).collect();
        self.shared.buckets.locked().retain(|(p, s), _| live.contains(&(p.as_str(), s.as_str())));
        // A workload's policies come in the routes of each of its services
        // that is bound here; once each (by namespace and name).
        let mut by_uid: HashMap<String, Vec<slipstream_core::policy::l7::L7Policy>> = HashMap::new();
        for r in map.values() {
            for p in &r.policies {
                for uid in p.workloads.iter().flatten() {
                    let list = by_uid.entry(uid.clone()).or_default();
                    if !list.iter().any(|q| q.namespace == p.namespace && q.name == p.name) {
                        list.push(p.clone());
                    }
                }
            }
        }
        self.shared.workload_policies.store(Arc::new(by_uid));
        self.shared.own_routes.store(map.iter().find(|(k, _)| self.shared.me.is_own_routes(k)).map(|(_, r)| r.clone()));
        let jwt: HashMap<String, Arc<Vec<Arc<jwt::Prepared>>>> = map
            .iter()
            .filter(|(_, r)| !r.jwt_rules.is_empty())
            .map(|(k, r)| (k.clone(), Arc::new(r.jwt_rules.iter().map(|j| Arc::new(jwt::Prepared::new(j))).collect())))
            .collect();
        self.shared.jwt_rules.store(Arc::new(jwt));
        self.shared.routes.store(Arc::new(map));
        self.shared.generation.send_modify(|g| *g += 1);
    }

    /// The graceful stop, shared with the HBONE server (its listener
    /// watches it too): moved on by `run` on SIGTERM, never back; tunnels
    /// and requests already open see each stage at once.
    pub fn drain(&self) -> &slipstream_hbone::drain::DrainTrigger {
        &self.shared.drain
    }

    /// Its request metrics (Prometheus text with [`metrics::Metrics::render`]).
    pub fn metrics(&self) -> Arc<metrics::Metrics> {
        self.shared.metrics.clone()
    }

    /// What the HBONE server calls for each CONNECT.
    pub fn handler(&self) -> Arc<handler::WaypointHandler> {
        Arc::new(handler::WaypointHandler { shared: self.shared.clone() })
    }
}
