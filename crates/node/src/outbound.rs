//! Outbound: a connection the pod opened, captured on 127.0.0.1:15001 inside
//! the pod. [`plan`] decides, once, over one mesh snapshot (pure: table
//! tests, no sockets); [`handle`] carries the plan out.

use crate::error::ProxyError;
use crate::selfcall::{self_call_in, Side};
use crate::sockets::reset;
use crate::state::{LocalPod, Shared};
use crate::telemetry::{AppSide, ConnInfo, ConnRecord, Metered, Reporter, SrcIdentity};
use futures_util::future::{self, Either, FutureExt};
use slipstream_core::abi::hbone_addr;
use slipstream_core::{Destination, MeshState, MeshWorkload, WorkloadType};
use slipstream_hbone::headers::{Baggage, Forwarded, WorkloadKind};
use slipstream_hbone::{ConnectRequest, PoolKey};
use slipstream_proxy::authz::AuthzKey;
use slipstream_proxy::limits::{Kind, SlotGuard, Taken};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Poll};
use std::time::Duration;
use tokio::net::TcpStream;

/// A captured connection, as the planner sees it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The source pod's workload, if the mesh knows it.
    pub src: Option<Arc<MeshWorkload>>,
    /// The app's address (the source pod's IP and its port).
    pub src_addr: SocketAddr,
    /// The source pod's own address (self-calls, the tunnel's source IP).
    pub pod_ip: IpAddr,
    /// The original destination.
    pub dst: SocketAddr,
    /// The endpoint the datapath chose at connect() for a service, honoured
    /// when this snapshot holds it among the port's endpoints.
    pub chosen: Option<SocketAddr>,
    /// Chooses among weighted endpoints (uniform random in production)
    /// when there is no such choice.
    pub draw: u64,
    /// False only in the in-process test tier (see `selfcall::self_call_in`).
    pub loopback_is_local: bool,
}

/// Where the connection goes.
#[derive(Debug, Clone)]
pub enum Route {
    /// Through an HBONE tunnel to the destination pod's node proxy.
    Hbone {
        /// Which pooled tunnel: source identity, expected destination
        /// identities, `<pod IP>:15008`, source IP.
        key: PoolKey,
        /// `:authority`: `<pod IP>:<target port>`.
        authority: SocketAddr,
        /// The service the app dialed (the `forwarded` header's `host=`).
        service_host: Option<Arc<str>>,
    },
    /// Plaintext to a destination outside the mesh.
    Passthrough { addr: SocketAddr },
}

/// One decision: where to, and what the connection's telemetry says.
#[derive(Debug, Clone)]
pub struct Plan {
    pub route: Route,
    pub info: ConnInfo,
}

/// Decides where a captured connection goes, over one snapshot.
pub fn plan(state: &MeshState, req: &Request) -> Result<Plan, ProxyError> {
    let own = [req.pod_ip];
    // Before anything else: a local destination was never captured, and
    // passing it through would dial the proxy itself.
    if let Some(why) = self_call_in(Side::Outbound, req.dst, &own, req.loopback_is_local) {
        return Err(ProxyError::SelfCall(why));
    }
    let (target, service) = match state.destination(req.dst.ip()) {
        // Bound to a waypoint: every connection goes through it, whatever
        // endpoint the kernel chose (docs/waypoint.md, "Binding").
        Destination::Service(svc) if svc.waypoint.is_some() => {
            let g = svc.waypoint.clone().expect("checked");
            return via_waypoint(state, req, &g, svc.hostname().clone(), Some(svc));
        }
        Destination::Workload(w) if w.waypoint.is_some() && w.meshed() => {
            let g = w.waypoint.clone().expect("checked");
            return via_waypoint(state, req, &g, Arc::from(req.dst.ip().to_string()), None);
        }
        Destination::Service(svc) => {
            let eps = state.endpoints(&svc, req.dst.port());
            let chosen = req
                .chosen
                .and_then(|c| eps.iter().find(|e| e.workload.capacity() > 0 && SocketAddr::new(e.workload.address(), e.target_port) == c));
            let ep = chosen
                .or_else(|| MeshState::pick(&eps, req.draw))
                .ok_or_else(|| ProxyError::NoEndpoints { service: Arc::from(svc.hostname.as_str()), port: req.dst.port() })?;
            let addr = SocketAddr::new(ep.workload.address(), ep.target_port);
            (Some((ep.workload.clone(), addr)), Some(svc))
        }
        Destination::Workload(w) => (Some((w, req.dst)), None),
        Destination::Unknown => (None, None),
    };
    // The network-policy layer on the address and port the connection
    // really goes to (a service's chosen endpoint): the source's egress
    // rules, and a destination outside the mesh's ingress rules.
    if let Some(src) = &req.src {
        let dst = target.as_ref().map_or(req.dst, |(_, addr)| *addr);
        slipstream_proxy::authz::outbound(state, src, req.src_addr, dst).map_err(ProxyError::Denied)?;
    }
    let info = |dst_addr, hbone_addr, dst: Option<Arc<MeshWorkload>>, mutual_tls: bool| ConnInfo {
        reporter: Reporter::Source,
        src_addr: req.src_addr,
        src: req.src.clone(),
        src_id: if mutual_tls { SrcIdentity::OfWorkload } else { SrcIdentity::None },
        dst_addr,
        hbone_addr,
        dst,
        service: service.clone(),
        mutual_tls,
    };
    match target {
        Some((w, authority)) if w.meshed() => {
            let src = req.src.as_ref().ok_or(ProxyError::UnknownSource(req.src_addr))?;
            let mut expected = vec![w.identity().clone()];
            if let Some(svc) = &service {
                expected.extend(svc.sans().iter().cloned());
            }
            let hbone = hbone_addr(w.address());
            let key = PoolKey::new(src.identity().clone(), expected, hbone, req.pod_ip);
            let service_host = service.as_ref().map(|s| Arc::from(s.hostname.as_str()));
            Ok(Plan { route: Route::Hbone { key, authority, service_host }, info: info(hbone, Some(authority), Some(w), true) })
        }
        Some((w, addr)) => Ok(Plan { route: Route::Passthrough { addr }, info: info(addr, None, Some(w), false) }),
        None => Ok(Plan { route: Route::Passthrough { addr: req.dst }, info: info(req.dst, None, None, false) }),
    }
}

/// The route through a waypoint: HBONE to one of its ready pods, with the
/// original destination as `:authority` (docs/protocols.md section 2),
/// expecting the waypoint's identity. The source's egress network policies
/// are the waypoint's to apply, on the endpoint it picks per request: here
/// the endpoint is not known yet.
fn via_waypoint(
    state: &MeshState,
    req: &Request,
    g: &slipstream_core::GatewayAddress,
    bound: Arc<str>,
    service: Option<Arc<slipstream_core::MeshService>>,
) -> Result<Plan, ProxyError> {
    let refuse = |why| ProxyError::NoWaypoint { bound: bound.clone(), waypoint: Arc::from(waypoint_name(g)), why };
    let src = req.src.as_ref().ok_or(ProxyError::UnknownSource(req.src_addr))?;
    if g.hbone_mtls_port == 0 {
        // The control plane's mark of a binding it could not make hold.
        return Err(refuse("does not take this traffic (it does not exist, or does not allow this namespace or this kind of traffic)"));
    }
    let (_, eps) = state.waypoint(g).map_err(refuse)?;
    // Only a pod that runs as the waypoint's own service account (the
    // Gateway's name, in its namespace) is the waypoint: another pod that
    // joined its Service, or a Service of that name made by someone else
    // while the Gateway is missing, gets nothing.
    let name = gateway_name(g);
    let eps: Vec<_> = eps
        .into_iter()
        .filter(|e| e.workload.identity().namespace() == g.namespace && e.workload.identity().service_account() == name)
        .collect();
    let ep = MeshState::pick(&eps, req.draw).ok_or_else(|| refuse("has no ready pod running as its own service account"))?;
    let hbone = SocketAddr::new(ep.workload.address(), ep.target_port);
    let key = PoolKey::new(src.identity().clone(), [ep.workload.identity().clone()], hbone, req.pod_ip);
    let service_host = service.as_ref().map(|s| Arc::from(s.hostname.as_str()));
    let info = ConnInfo {
        reporter: Reporter::Source,
        src_addr: req.src_addr,
        src: req.src.clone(),
        src_id: SrcIdentity::OfWorkload,
        dst_addr: hbone,
        hbone_addr: Some(req.dst),
        dst: Some(ep.workload.clone()),
        service,
        mutual_tls: true,
    };
    Ok(Plan { route: Route::Hbone { key, authority: req.dst, service_host }, info })
}

/// The waypoint's Gateway name: the first label of its Service hostname.
fn gateway_name(g: &slipstream_core::GatewayAddress) -> &str {
    g.hostname.split('.').next().unwrap_or(&g.hostname)
}

/// `namespace/name` of the waypoint's Gateway.
fn waypoint_name(g: &slipstream_core::GatewayAddress) -> String {
    format!("{}/{}", g.namespace, gateway_name(g))
}

/// Carries out the plan for one captured connection of `pod`.
///
/// Two phases, for memory: `setup` (plan, connect, handshake) runs boxed,
/// so its state is freed once connected; what stays for the connection's
/// lifetime is the copy and its record. Combinators rather than an `async
/// fn`, which would keep its arguments and every moved-from local in the
/// task for the connection's life.
pub fn handle(shared: Arc<Shared>, pod: LocalPod, app: TcpStream, peer: SocketAddr) -> impl Future<Output = ()> + Send + 'static {
    Box::pin(setup(shared, pod, app, peer)).then(|carry| match carry {
        Some(Carry::Hbone { mut record, tunnel, app, budget }) => {
            record.established();
            let budget: std::sync::Arc<dyn slipstream_hbone::copy::BufferBudget> = budget;
            let mut copy = slipstream_hbone::copy::bidirectional_within(tunnel, app, Some(budget));
            let mut record = Some(record);
            // Cancellation is polled with the copy, so it ends the
            // connection whatever the copy waits for.
            Either::Left(future::poll_fn(move |cx| {
                let Some(r) = record.as_ref() else { return Poll::Ready(()) };
                let (stats, result) = if r.poll_cancelled(cx) {
                    // The record closes with the cancellation's reason, and
                    // the app sees a reset, not a clean end of stream.
                    reset(copy.other_mut());
                    (copy.stats(), Ok(()))
                } else {
                    let (stats, result) = ready!(Pin::new(&mut copy).poll(cx));
                    (stats, result.map_err(ProxyError::from))
                };
                if let Some(r) = record.take() {
                    r.close_counted(stats.to_tunnel, stats.from_tunnel, result);
                }
                Poll::Ready(())
            }))
        }
        // Refused (already recorded) or outside the mesh, both rare: boxed,
        // so they do not size the tunnels' futures.
        None => Either::Right(future::ready(()).boxed()),
        Some(Carry::Passthrough { app, upstream, _upstream_fd }) => Either::Right(
            async move {
                let _upstream_fd = _upstream_fd;
                crate::relay::copy_plain(app, upstream).await;
            }
            .boxed(),
        ),
    })
}

/// A connected connection, ready to carry bytes.
enum Carry {
    Hbone {
        record: ConnRecord,
        tunnel: slipstream_hbone::TunnelStream,
        app: TcpStream,
        /// The pod's share of the buffer budget.
        budget: Arc<slipstream_proxy::limits::Source>,
    },
    /// Holds a second descriptor of the budget (the upstream socket).
    Passthrough { app: Metered<TcpStream>, upstream: TcpStream, _upstream_fd: SlotGuard },
}

/// How long a pod's connection waits for the mesh to name the pod: a pod
/// registered from its CNI call on Kubernetes (its first init container)
/// may connect before the control plane has seen its address.
const SOURCE_WAIT: Duration = Duration::from_secs(15);

/// Waits up to [`SOURCE_WAIT`] for the mesh to name a pod it does not name
/// yet; the snapshot that names it, and its workload.
async fn wait_for_source(shared: &Shared, uid: &str) -> Option<(Arc<MeshState>, Arc<MeshWorkload>)> {
    let deadline = tokio::time::Instant::now() + SOURCE_WAIT;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let snap = shared.snapshot();
        if let Some(w) = snap.workload(uid) {
            return Some((snap, w));
        }
    }
    None
}

/// Plans and connects; `None` when the connection was refused (and already
/// recorded).
async fn setup(shared: Arc<Shared>, pod: LocalPod, app: TcpStream, peer: SocketAddr) -> Option<Carry> {
    let (dst, chosen) = match pod.sockets.original_dst(&app) {
        Ok(d) => (d.dialed, d.endpoint),
        Err(e) => {
            tracing::warn!(pod = %pod.uid, "{}", ProxyError::NoOriginalDestination(Arc::new(e)));
            shared.telemetry.metrics.rejected_because(slipstream_hbone::ResponseFlag::ProtocolError, "no_original_destination");
            return None;
        }
    };
    let mut snap = shared.snapshot();
    let loopback_is_local = pod.sockets.loopback_is_local();
    // Steered at connect() (eBPF), the app dialed 127.0.0.1 from
    // 127.0.0.1: it is still the pod speaking, from its own address.
    let peer = if loopback_is_local && peer.ip().is_loopback() { SocketAddr::new(pod.ip, peer.port()) } else { peer };
    let mut req =
        Request { src: snap.workload(&pod.uid), src_addr: peer, pod_ip: pod.ip, dst, chosen, draw: rand::random(), loopback_is_local };
    let refuse = |info: ConnInfo, e: ProxyError| {
        reset(&app);
        ConnRecord::open(info, shared.telemetry.clone()).close(Err(e));
    };
    // This pod's bounds first (two atomic operations each when under
    // them): a flooding pod's refusals cost no plan.
    let (held, _pending) = match admit(&pod) {
        Ok(h) => h,
        Err(e) => {
            refuse(bare_info(&req), e);
            return None;
        }
    };
    // A pod the mesh does not name yet (registered from its CNI call on
    // Kubernetes) waits for it, inside its bounds: a connection waiting
    // holds one of the pod's open and pending slots like any other.
    if req.src.is_none() {
        if let Some((named, w)) = wait_for_source(&shared, &pod.uid).await {
            (snap, req.src) = (named, Some(w));
        }
    }
    let Plan { route, info } = match plan(&snap, &req) {
        Ok(p) => p,
        Err(e) => {
            refuse(bare_info(&req), e);
            return None;
        }
    };
    // Registered with what its egress decision was made on, so a policy
    // change decides it again (and closes it if now denied).
    let final_dst = match &route {
        Route::Hbone { authority, .. } => *authority,
        Route::Passthrough { addr } => *addr,
    };
    let registration = pod.conns.register(Some(AuthzKey { peer: None, src: req.src_addr, dst: final_dst, outbound: true }));
    let record = ConnRecord::open(info, shared.telemetry.clone()).holding(held).registered(registration);
    match route {
        Route::Passthrough { addr } => {
            // The upstream socket is a second descriptor.
            let upstream_fd = match shared.limits.take_budget(1) {
                Ok(g) => g,
                Err(over) => {
                    reset(&app);
                    record.close(Err(over.into()));
                    return None;
                }
            };
            match pod.sockets.connect_marked(addr, shared.config.timeouts.upstream_connect).await {
                Ok(upstream) => {
                    let app = Metered::new(app, record, AppSide::Client).within(pod.limits.clone());
                    Some(Carry::Passthrough { app, upstream, _upstream_fd: upstream_fd })
                }
                Err(e) => {
                    reset(&app);
                    record.close(Err(ProxyError::connect(addr, e)));
                    None
                }
            }
        }
        Route::Hbone { key, authority, service_host } => {
            // A peer that asked this pod to hold off (it broke connections
            // there on purpose) is not asked again until then.
            let now = std::time::Instant::now();
            if let Some(until) = shared.hold_offs.holding(pod.ip, key.dst(), now) {
                reset(&app);
                let secs = until.saturating_duration_since(now).as_secs().max(1) as u32;
                record.close(Err(slipstream_hbone::HboneError::CoolingDown { peer: pod.ip, secs }.into()));
                return None;
            }
            let mut req = ConnectRequest::new(authority)
                .with_fresh_traceparent()
                .with_forwarded(&Forwarded::new(peer, service_host.map(|h| h.to_string())));
            if let Some(w) = &record.info().src {
                req = req.with_baggage(&baggage(w));
            }
            match shared.pool.connect(&key, req).await {
                Ok(tunnel) => Some(Carry::Hbone { record, tunnel, app, budget: pod.limits.clone() }),
                Err(e) => {
                    if let Some(secs) = e.retry_after() {
                        shared.hold_offs.hold(pod.ip, key.dst(), secs, std::time::Instant::now());
                    }
                    tracing::debug!(pod = %pod.uid, %authority, "HBONE connect failed: {e}");
                    reset(&app);
                    record.close(Err(e.into()));
                    None
                }
            }
        }
    }
}

/// What is known of a connection refused before it was planned.
fn bare_info(req: &Request) -> ConnInfo {
    ConnInfo {
        reporter: Reporter::Source,
        src_addr: req.src_addr,
        src: req.src.clone(),
        src_id: SrcIdentity::None,
        dst_addr: req.dst,
        hbone_addr: None,
        dst: None,
        service: None,
        mutual_tls: false,
    }
}

/// Takes the pod's slots for a new outbound connection: one open
/// connection (kept with its record) and one in set-up (dropped when
/// `setup` returns).
fn admit(pod: &LocalPod) -> Result<(Taken, Taken), ProxyError> {
    let held = pod.limits.take(Kind::PodOpen, 1)?;
    Ok((held, pod.limits.take(Kind::PodPending, 0)?))
}

fn baggage(w: &MeshWorkload) -> Baggage {
    let kind = match w.workload_type {
        WorkloadType::Deployment => WorkloadKind::Deployment,
        WorkloadType::Pod => WorkloadKind::Pod,
        WorkloadType::Job => WorkloadKind::Job,
        WorkloadType::Cronjob => WorkloadKind::CronJob,
    };
    Baggage {
        cluster_name: w.cluster_id.clone(),
        namespace: w.namespace.clone(),
        workload: Some((kind, w.workload_name.clone())),
        service_name: w.canonical_name.clone(),
        service_version: w.canonical_revision.clone(),
    }
}

#[cfg(test)]
mod tests;
