//! Outbound: a connection the pod opened, captured on 127.0.0.1:15001 inside
//! the pod. `plan` decides (pure, over a snapshot of the mesh); `proxy`
//! carries it out.

use crate::conn::{ConnInfo, ConnRecord};
use crate::inpod::LocalPod;
use crate::limits::{Kind, OverLimit, SlotGuard, Taken};
use crate::metrics::{Reporter, ResponseFlag};
use crate::proxy::Shared;
use crate::selfcall::{self_call, SelfCall, Side};
use crate::sockets::{original_dst, reset};
use futures_util::future::{self, Either, FutureExt};
use slipstream_core::state::hbone_addr;
use slipstream_core::{Destination, MeshState, Service, Workload, WorkloadType};
use slipstream_hbone::headers::{Baggage, Forwarded, WorkloadKind};
use slipstream_hbone::{ConnectRequest, PoolKey};
use slipstream_identity::SpiffeId;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tokio::net::TcpStream;

#[derive(Debug, Clone)]
pub enum Plan {
    /// Through an HBONE tunnel to the destination pod's node proxy.
    Hbone {
        /// `<pod IP>:15008`.
        hbone: SocketAddr,
        /// `:authority`: `<pod IP>:<target port>`.
        authority: SocketAddr,
        /// The server certificate must carry one of these SPIFFE IDs.
        expected_identities: Vec<String>,
        workload: Arc<Workload>,
        service: Option<Arc<Service>>,
    },
    /// Plaintext to a destination outside the mesh.
    Passthrough { addr: SocketAddr, workload: Option<Arc<Workload>>, service: Option<Arc<Service>> },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("service {service} has no healthy endpoint for port {port}")]
    NoEndpoints { service: String, port: u16 },
    /// The pod connected to the proxy's listener itself, or to another
    /// local destination capture never redirects (see `selfcall`).
    #[error("{0}")]
    SelfCall(SelfCall),
}

impl PlanError {
    pub fn flag(&self) -> ResponseFlag {
        match self {
            Self::NoEndpoints { .. } => ResponseFlag::Connect,
            Self::SelfCall(_) => ResponseFlag::SelfCall,
        }
    }
}

/// Decides where a captured connection to `dst` goes; `own` are the source
/// pod's addresses. `draw` chooses among weighted endpoints (uniform random
/// in production, fixed in tests).
pub fn plan(state: &MeshState, own: &[IpAddr], dst: SocketAddr, draw: u64) -> Result<Plan, PlanError> {
    // Before anything else: a local destination was never captured, and
    // passing it through would dial the proxy itself.
    if let Some(why) = self_call(Side::Outbound, dst, own) {
        return Err(PlanError::SelfCall(why));
    }
    match state.destination(dst.ip()) {
        Destination::Service(svc) => {
            let eps = state.endpoints(&svc, dst.port());
            let (w, target) = MeshState::pick(&eps, draw)
                .cloned()
                .ok_or_else(|| PlanError::NoEndpoints { service: svc.hostname.clone(), port: dst.port() })?;
            let ip = w.addresses.first().copied().expect("workloads in endpoints have an address");
            if w.meshed() {
                let mut expected = vec![w.spiffe_id()];
                expected.extend(svc.subject_alt_names.iter().cloned());
                Ok(Plan::Hbone {
                    hbone: hbone_addr(ip),
                    authority: SocketAddr::new(ip, target),
                    expected_identities: expected,
                    workload: w,
                    service: Some(svc),
                })
            } else {
                Ok(Plan::Passthrough { addr: SocketAddr::new(ip, target), workload: Some(w), service: Some(svc) })
            }
        }
        Destination::Workload(w) if w.meshed() => Ok(Plan::Hbone {
            hbone: hbone_addr(dst.ip()),
            authority: dst,
            expected_identities: vec![w.spiffe_id()],
            workload: w,
            service: None,
        }),
        Destination::Workload(w) => Ok(Plan::Passthrough { addr: dst, workload: Some(w), service: None }),
        Destination::Unknown => Ok(Plan::Passthrough { addr: dst, workload: None, service: None }),
    }
}

/// Carries out the plan for one captured connection of `pod`.
///
/// Two phases, for memory: `setup` (plan, connect, handshake) runs boxed,
/// so its state is freed once connected; what stays for the connection's
/// lifetime is the copy and its record. Combinators rather than an `async
/// fn`, which would keep its arguments and every moved-from local in the
/// task for the connection's life (the hbone crate's serve_stream says
/// more).
pub fn handle(shared: Arc<Shared>, pod: LocalPod, app: TcpStream, peer: SocketAddr) -> impl Future<Output = ()> + Send + 'static {
    Box::pin(setup(shared, pod, app, peer)).then(|carry| match carry {
        Some(Carry::Hbone { record, tunnel, app }) => Either::Left(
            slipstream_hbone::copy::bidirectional(tunnel, app)
                .map(move |(stats, r)| record.close(stats.to_tunnel, stats.from_tunnel, r.err().map(|e| (e.flag(), e.to_string())))),
        ),
        // Refused (already recorded) or outside the mesh, both rare: boxed,
        // so they do not size the tunnels' futures.
        None => Either::Right(future::ready(()).boxed()),
        Some(Carry::Passthrough { record, mut app, mut upstream, _upstream_fd }) => Either::Right(
            async move {
                let _upstream_fd = _upstream_fd;
                let r = tokio::io::copy_bidirectional_with_sizes(&mut app, &mut upstream, 64 * 1024, 64 * 1024).await;
                match r {
                    Ok((up, down)) => record.close(up, down, None),
                    Err(e) => record.close(0, 0, Some((ResponseFlag::ConnectionTerminated, e.to_string()))),
                }
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
    },
    /// Holds a second descriptor of the budget (the upstream socket).
    Passthrough {
        record: ConnRecord,
        app: TcpStream,
        upstream: TcpStream,
        _upstream_fd: SlotGuard,
    },
}

/// Plans and connects; `None` when the connection was refused (and already
/// recorded).
async fn setup(shared: Arc<Shared>, pod: LocalPod, app: TcpStream, peer: SocketAddr) -> Option<Carry> {
    let dst = match original_dst(&app) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(pod = %pod.uid, "captured connection without an original destination: {e}");
            shared.telemetry.metrics.rejected(ResponseFlag::ProtocolError);
            return None;
        }
    };
    let snap = shared.snapshot.borrow().clone();
    let src = snap.mesh.workload(&pod.uid);
    let src_identity = src.as_ref().map(|w| w.spiffe_id()).unwrap_or_default();
    let info = |dst_addr, hbone_addr, dst: Option<Arc<Workload>>, service: Option<Arc<Service>>, mtls| ConnInfo {
        reporter: Reporter::Source,
        src_addr: peer,
        src: src.clone(),
        src_identity: if mtls { src_identity.clone() } else { String::new() },
        dst_addr,
        hbone_addr,
        dst_identity: dst.as_ref().filter(|_| mtls).map(|w| w.spiffe_id()).unwrap_or_default(),
        dst,
        service,
        mutual_tls: mtls,
    };
    // This pod's bounds first: two atomic operations each when under them.
    let (held, _pending) = match admit(&pod) {
        Ok(h) => h,
        Err(over) => {
            reset(&app);
            ConnRecord::open(info(dst, None, None, None, false), shared.telemetry.clone()).refuse(over.flag, over.to_string(), &pod.uid);
            return None;
        }
    };
    match plan(&snap.mesh, std::slice::from_ref(&pod.ip), dst, rand::random()) {
        Err(e) => {
            let record = ConnRecord::open(info(dst, None, None, None, false), shared.telemetry.clone());
            reset(&app);
            match e {
                // A pod repeats its self-calls on purpose: rate-limited log per source.
                PlanError::SelfCall(_) => record.refuse(e.flag(), e.to_string(), &pod.uid),
                _ => record.close(0, 0, Some((e.flag(), e.to_string()))),
            }
            None
        }
        Ok(Plan::Passthrough { addr, workload, service }) => {
            let record = ConnRecord::open(info(addr, None, workload, service, false), shared.telemetry.clone()).holding(held);
            // The upstream socket is a second descriptor.
            let upstream_fd = match shared.limits.take_budget(1) {
                Ok(g) => g,
                Err(over) => {
                    reset(&app);
                    record.refuse(over.flag, over.to_string(), &pod.uid);
                    return None;
                }
            };
            match pod.sockets.connect_marked(addr, shared.config.connect_timeout).await {
                Ok(upstream) => Some(Carry::Passthrough { record, app, upstream, _upstream_fd: upstream_fd }),
                Err(e) => {
                    reset(&app);
                    record.close(0, 0, Some((ResponseFlag::Connect, format!("connect to {addr}: {e}"))));
                    None
                }
            }
        }
        Ok(Plan::Hbone { hbone, authority, expected_identities, workload, service }) => {
            let record =
                ConnRecord::open(info(authority, Some(hbone), Some(workload.clone()), service.clone(), true), shared.telemetry.clone())
                    .holding(held);
            let ids: Result<Vec<SpiffeId>, _> = expected_identities.iter().map(|i| i.parse::<SpiffeId>()).collect();
            let (Ok(src_id), Ok(ids)) = (src_identity.parse::<SpiffeId>(), ids) else {
                reset(&app);
                record.close(0, 0, Some((ResponseFlag::IdentityError, "invalid SPIFFE identity in the mesh configuration".into())));
                return None;
            };
            let key = PoolKey::new(src_id, ids, hbone, pod.ip);
            let mut req = ConnectRequest::new(authority)
                .with_fresh_traceparent()
                .with_forwarded(&Forwarded::new(peer, service.as_ref().map(|s| s.hostname.clone())));
            if let Some(w) = &src {
                req = req.with_baggage(&baggage(w));
            }
            match shared.pool.connect(&key, req).await {
                Ok(tunnel) => Some(Carry::Hbone { record, tunnel, app }),
                Err(e) => {
                    tracing::debug!(pod = %pod.uid, %authority, "HBONE connect failed: {e}");
                    reset(&app);
                    record.close(0, 0, Some((e.flag(), e.to_string())));
                    None
                }
            }
        }
    }
}

/// Takes the pod's slots for a new outbound connection: one open
/// connection (kept with its record) and one in set-up (dropped when
/// `setup` returns).
fn admit(pod: &LocalPod) -> Result<(Taken, Taken), OverLimit> {
    let held = pod.limits.take(Kind::PodOpen, 1)?;
    Ok((held, pod.limits.take(Kind::PodPending, 0)?))
}

fn baggage(w: &Workload) -> Baggage {
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
mod tests {
    use super::*;
    use slipstream_core::*;

    fn size_of_future<A, B, C, D, F>(_: fn(A, B, C, D) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn the_future_of_an_open_connection_stays_small() {
        // 10k open connections hold 10k of these (an async fn was 1040 bytes).
        let size = size_of_future(handle);
        println!("outbound handle: {size} bytes");
        assert!(size <= 512, "{size} bytes");
    }

    /// The source pod's own address.
    const OWN: &[IpAddr] = &[IpAddr::V4(std::net::Ipv4Addr::new(10, 244, 1, 5))];

    fn wl(name: &str, ip: &str, meshed: bool, sa: &str) -> Workload {
        let mut services = std::collections::BTreeMap::new();
        services.insert("default/echo.default.svc.cluster.local".to_string(), vec![Port { service_port: 80, target_port: 8080 }]);
        Workload {
            uid: format!("c//Pod/default/{name}"),
            name: name.into(),
            namespace: "default".into(),
            addresses: vec![ip.parse().unwrap()],
            tunnel_protocol: if meshed { TunnelProtocol::Hbone } else { TunnelProtocol::None },
            service_account: sa.into(),
            services,
            ..Default::default()
        }
    }

    fn state(meshed: bool) -> MeshState {
        MeshState::new(&MeshConfig {
            workloads: vec![wl("echo", "10.244.2.2", meshed, "echo"), wl("plain", "10.244.2.9", false, "")],
            services: vec![Service {
                name: "echo".into(),
                namespace: "default".into(),
                hostname: "echo.default.svc.cluster.local".into(),
                addresses: vec![NetworkAddress { network: String::new(), address: "10.96.0.10".parse().unwrap() }],
                ports: vec![Port { service_port: 80, target_port: 8080 }],
                subject_alt_names: vec!["spiffe://cluster.local/ns/default/sa/extra".into()],
            }],
            policies: vec![],
        })
    }

    #[test]
    fn service_vip_to_meshed_endpoint_uses_hbone_with_mapped_port() {
        let p = plan(&state(true), OWN, "10.96.0.10:80".parse().unwrap(), 0).unwrap();
        let Plan::Hbone { hbone, authority, expected_identities, service, .. } = p else { panic!("{p:?}") };
        assert_eq!(hbone, "10.244.2.2:15008".parse().unwrap());
        assert_eq!(authority, "10.244.2.2:8080".parse().unwrap(), "service port mapped to target port");
        assert_eq!(expected_identities, vec!["spiffe://cluster.local/ns/default/sa/echo", "spiffe://cluster.local/ns/default/sa/extra"]);
        assert_eq!(service.unwrap().name, "echo");
    }

    #[test]
    fn pod_ip_direct() {
        let Plan::Hbone { authority, expected_identities, service, .. } =
            plan(&state(true), OWN, "10.244.2.2:9000".parse().unwrap(), 0).unwrap()
        else {
            panic!()
        };
        assert_eq!(authority, "10.244.2.2:9000".parse().unwrap());
        assert_eq!(expected_identities, vec!["spiffe://cluster.local/ns/default/sa/echo"]);
        assert!(service.is_none());
    }

    #[test]
    fn outside_the_mesh_passes_through() {
        assert!(
            matches!(plan(&state(false), OWN, "10.96.0.10:80".parse().unwrap(), 0).unwrap(), Plan::Passthrough { addr, .. } if addr == "10.244.2.2:8080".parse().unwrap())
        );
        assert!(matches!(plan(&state(true), OWN, "10.244.2.9:80".parse().unwrap(), 0).unwrap(), Plan::Passthrough { .. }));
        assert!(matches!(plan(&state(true), OWN, "192.0.2.1:443".parse().unwrap(), 0).unwrap(), Plan::Passthrough { workload: None, .. }));
    }

    #[test]
    fn unknown_service_port_has_no_endpoints() {
        let e = plan(&state(true), OWN, "10.96.0.10:81".parse().unwrap(), 0).unwrap_err();
        assert_eq!(e.to_string(), "service echo.default.svc.cluster.local has no healthy endpoint for port 81");
    }

    #[test]
    fn local_destinations_are_self_calls_before_anything_else() {
        // (destination, expected): every local destination is refused
        // whatever the mesh says, even one that names a meshed workload.
        let cases = [
            ("127.0.0.1:15001", true),
            ("127.0.0.2:15001", true),
            ("[::ffff:127.0.0.1]:15001", true),
            ("0.0.0.0:15001", true),
            ("10.244.1.5:15001", true),
            ("10.244.1.5:15006", true),
            ("10.244.1.5:15008", true),
            ("10.244.1.5:15020", true),
            ("10.244.1.5:8080", true),
            ("[::1]:443", true),
            ("10.244.2.2:15008", false),
            ("10.96.0.10:80", false),
            ("192.0.2.1:15001", false),
        ];
        let config = MeshConfig {
            workloads: vec![wl("echo", "10.244.2.2", true, "echo"), wl("client", "10.244.1.5", true, "client")],
            services: vec![],
            policies: vec![],
        };
        let with_self = MeshState::new(&config);
        for (dst, refused) in cases {
            let r = plan(&with_self, OWN, dst.parse().unwrap(), 0);
            match r {
                Err(e @ PlanError::SelfCall(_)) => {
                    assert!(refused, "{dst}: {e}");
                    assert_eq!(e.flag(), ResponseFlag::SelfCall);
                    assert!(e.to_string().starts_with("self-call refused: "), "{e}");
                }
                other => assert!(!refused, "{dst}: expected a self-call refusal, got {other:?}"),
            }
        }
    }
}
