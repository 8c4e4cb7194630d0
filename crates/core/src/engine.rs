//! One connection, both layers, both ends: what the node proxies enforce
//! and what `slipstream policy check` answers, from one mesh snapshot.
//!
//! - egress, network layer: the policies selecting the source workload;
//! - ingress, network layer: the policies selecting the destination
//!   workload;
//! - ingress, Istio layer: the AuthorizationPolicies (and converted
//!   PeerAuthentications) of the destination, if it is meshed; they see
//!   the source's verified identity, which exists only when both ends are
//!   meshed (the connection then travels in HBONE).
//!
//! The connection is allowed when all three allow. Each part is also
//! exposed alone: the source's node proxy decides egress, the
//! destination's node proxy ingress.

use crate::policy::network::{self, Direction, Flow, L4Protocol};
use crate::policy::{ConnAttrs, LayerVerdict, PolicyRule};
use crate::spiffe::SpiffeId;
use crate::state::{MeshState, MeshWorkload};
use serde::Serialize;
use std::net::IpAddr;

/// A connection's facts as policy sees them.
#[derive(Debug, Clone, Copy)]
pub struct Connection<'a> {
    pub protocol: L4Protocol,
    pub src_ip: IpAddr,
    /// The verified identity of the source (mTLS), None for plaintext.
    pub peer: Option<&'a SpiffeId>,
    pub dst_ip: IpAddr,
    pub dst_port: u16,
}

impl Connection<'_> {
    fn flow(&self, direction: Direction) -> Flow {
        let peer_ip = match direction {
            Direction::Ingress => self.src_ip,
            Direction::Egress => self.dst_ip,
        };
        Flow { protocol: self.protocol, peer_ip, destination_ip: self.dst_ip, destination_port: self.dst_port }
    }
}

/// The network layer for one end: `w` is the source for egress, the
/// destination for ingress. A workload no policy selects is not isolated.
pub fn network(state: &MeshState, w: &MeshWorkload, direction: Direction, c: &Connection) -> LayerVerdict {
    let ps = state.net_policies_for(&w.uid);
    network::evaluate(ps.iter().map(|p| p.as_ref()), direction, &c.flow(direction))
}

/// The Istio layer at the destination: not applicable to a destination
/// outside the mesh.
pub fn istio(state: &MeshState, dst: &MeshWorkload, c: &Connection, dry_run: &mut Vec<PolicyRule>) -> LayerVerdict {
    if !dst.meshed() {
        return LayerVerdict::not_applicable();
    }
    let ps = state.policies_for(dst);
    let principal = c.peer.map(SpiffeId::principal);
    let attrs = ConnAttrs {
        principal,
        namespace: c.peer.map(SpiffeId::namespace),
        source_ip: c.src_ip,
        destination_ip: c.dst_ip,
        destination_port: c.dst_port,
        request: None,
    };
    crate::policy::evaluate(ps.iter().map(|p| p.as_ref()), &attrs, dry_run)
}

/// Everything the destination decides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IngressVerdict {
    pub network: LayerVerdict,
    pub istio: LayerVerdict,
    /// Dry-run AuthorizationPolicies that would have matched.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<PolicyRule>,
}

impl IngressVerdict {
    pub fn allowed(&self) -> bool {
        self.network.allowed && self.istio.allowed
    }

    /// The layer that denied, network first.
    pub fn denial(&self) -> Option<&LayerVerdict> {
        [&self.network, &self.istio].into_iter().find(|l| !l.allowed)
    }
}

pub fn ingress(state: &MeshState, dst: &MeshWorkload, c: &Connection) -> IngressVerdict {
    let mut dry_run = Vec::new();
    let network = network(state, dst, Direction::Ingress, c);
    let istio = istio(state, dst, c, &mut dry_run);
    IngressVerdict { network, istio, dry_run }
}

/// A whole connection between two known workloads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub allowed: bool,
    /// The source's egress (network layer).
    pub egress: LayerVerdict,
    /// The destination's ingress (network and Istio layers).
    pub ingress: IngressVerdict,
}

impl Verdict {
    /// The layer that denied: egress first, as the packet would meet it.
    pub fn denial(&self) -> Option<&LayerVerdict> {
        if !self.egress.allowed {
            return Some(&self.egress);
        }
        self.ingress.denial()
    }
}

/// Decides a connection from `src` to `dst` on `port`, as the mesh would
/// carry it: with the source's identity when both ends are meshed (HBONE),
/// as plaintext otherwise.
pub fn connection(state: &MeshState, src: &MeshWorkload, dst: &MeshWorkload, protocol: L4Protocol, port: u16) -> Verdict {
    let peer = (src.meshed() && dst.meshed()).then(|| src.identity());
    let c = Connection { protocol, src_ip: src.address(), peer, dst_ip: dst.address(), dst_port: port };
    let egress = network(state, src, Direction::Egress, &c);
    let ingress = ingress(state, dst, &c);
    Verdict { allowed: egress.allowed && ingress.allowed(), egress, ingress }
}

/// A question `slipstream policy check` answers: may pod `from` open a
/// connection to pod `to` on `port`?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    pub from: PodName,
    pub to: PodName,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct PodName {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for PodName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// `NAMESPACE/POD`, or `NAMESPACE/deploy/NAME` for a Deployment's pod (as
/// kubectl names it: `deploy`, `deployment`, `deployments`).
impl std::str::FromStr for PodName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: expected NAMESPACE/POD or NAMESPACE/deploy/NAME");
        let (ns, rest) = s.split_once('/').ok_or_else(bad)?;
        let ok = |n: &str| !n.is_empty() && !n.contains('/');
        match rest.split_once('/') {
            None if ok(ns) && ok(rest) => Ok(PodName { namespace: ns.to_string(), name: rest.to_string() }),
            Some((kind, name)) if ok(ns) && ok(name) && DEPLOYMENT_WORDS.contains(&kind) => {
                Ok(PodName { namespace: ns.to_string(), name: format!("deploy/{name}") })
            }
            _ => Err(bad()),
        }
    }
}

const DEPLOYMENT_WORDS: &[&str] = &["deploy", "deployment", "deployments", "deployment.apps"];

/// The pod a name means: the pod itself, or a Deployment's first pod by
/// name.
fn find(state: &MeshState, p: &PodName) -> Result<std::sync::Arc<MeshWorkload>, QuestionError> {
    let found = match p.name.strip_prefix("deploy/") {
        Some(d) => {
            state.workloads().filter(|w| w.namespace == p.namespace && w.workload_name == d).min_by(|a, b| a.name.cmp(&b.name)).cloned()
        }
        None => state.workloads().find(|w| w.namespace == p.namespace && w.name == p.name).cloned(),
    };
    found.ok_or_else(|| QuestionError::UnknownPod(p.clone()))
}

/// The answer, with what it was decided on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Answer {
    pub from: PodName,
    pub to: PodName,
    pub port: u16,
    /// "allow" or "deny".
    pub verdict: &'static str,
    /// Whether the connection travels in HBONE (both ends meshed), with the
    /// source's identity; plaintext otherwise.
    pub mtls: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_identity: Option<String>,
    #[serde(flatten)]
    pub detail: Verdict,
    /// The paths through a waypoint the connection can take (to the pod's
    /// own address when the pod is bound to one, through each Service of
    /// the pod on this port bound to one), each with both decisions.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waypoints: Vec<WaypointPath>,
}

/// The connection through a waypoint: the waypoint decides with the
/// original client (the source's egress and the destination's own
/// policies, as if the client came directly: `detail` of the answer), then
/// the destination's node proxy decides on the waypoint's connection,
/// which carries the waypoint's identity and address (and which policies
/// let through: the waypoint has decided them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WaypointPath {
    /// `the pod's address`, or `service <namespace>/<name>`.
    pub via: String,
    /// `namespace/name` of the waypoint's Gateway.
    pub waypoint: String,
    pub waypoint_identity: String,
    /// "allow" or "deny".
    pub verdict: &'static str,
    /// At the waypoint, with the original client.
    pub at_waypoint: Verdict,
    /// At the destination's node proxy, with the waypoint's identity; None
    /// when the waypoint has no ready pod (the connection is then refused
    /// by the source's node proxy, `NO_WAYPOINT`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_destination: Option<IngressVerdict>,
    /// Why the waypoint cannot be reached, if it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreachable: Option<String>,
}

/// The waypoint paths from `src` to `dst` on `port` (see [`WaypointPath`]).
pub fn waypoint_paths(state: &MeshState, src: &MeshWorkload, dst: &MeshWorkload, port: u16, direct: &Verdict) -> Vec<WaypointPath> {
    if !src.meshed() || !dst.meshed() {
        // Only a meshed source's traffic is captured and sent to a waypoint.
        return Vec::new();
    }
    let mut bound: Vec<(String, crate::GatewayAddress)> = Vec::new();
    if let Some(g) = &dst.waypoint {
        bound.push(("pod address".into(), g.clone()));
    }
    for (key, ports) in &dst.services {
        let Some(svc) = state.service(key) else { continue };
        if let (Some(g), true) = (&svc.waypoint, ports.iter().any(|p| p.target_port == port)) {
            bound.push((format!("service {}/{}", svc.namespace, svc.name), g.clone()));
        }
    }
    bound
        .into_iter()
        .map(|(via, g)| {
            let name = g.hostname.split('.').next().unwrap_or(&g.hostname).to_string();
            let identity = SpiffeId::new(dst.identity().trust_domain().as_str(), &g.namespace, &name);
            let waypoint = format!("{}/{name}", g.namespace);
            let waypoint_identity = identity.as_ref().map(|i| i.to_string()).unwrap_or_default();
            let reachable = if g.hbone_mtls_port == 0 {
                Err("does not take this traffic (it does not exist, or does not allow this namespace or this kind of traffic)".to_string())
            } else {
                state.waypoint(&g).map_err(str::to_string)
            };
            let at_destination = match (&reachable, &identity) {
                (Ok((_, eps)), Ok(id)) => eps.first().map(|wp| {
                    let c = Connection {
                        protocol: L4Protocol::Tcp,
                        src_ip: wp.workload.address(),
                        peer: Some(id),
                        dst_ip: dst.address(),
                        dst_port: port,
                    };
                    ingress(state, dst, &c)
                }),
                _ => None,
            };
            let allowed = reachable.is_ok() && direct.allowed && at_destination.as_ref().is_some_and(IngressVerdict::allowed);
            WaypointPath {
                via,
                waypoint,
                waypoint_identity,
                verdict: if allowed { "allow" } else { "deny" },
                at_waypoint: direct.clone(),
                at_destination,
                unreachable: reachable.err(),
            }
        })
        .collect()
}

/// A question the state cannot answer: a pod it does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuestionError {
    #[error("no pod {0} in the mesh state (pods are known once they have an address)")]
    UnknownPod(PodName),
    #[error("port 0 is not a port (1-65535)")]
    BadPort,
}

/// Answers a question from one snapshot.
pub fn check(state: &MeshState, q: &Question) -> Result<Answer, QuestionError> {
    if q.port == 0 {
        return Err(QuestionError::BadPort);
    }
    let (src, dst) = (find(state, &q.from)?, find(state, &q.to)?);
    let detail = connection(state, &src, &dst, L4Protocol::Tcp, q.port);
    let waypoints = waypoint_paths(state, &src, &dst, q.port, &detail);
    let mtls = src.meshed() && dst.meshed();
    let pod = |w: &MeshWorkload| PodName { namespace: w.namespace.clone(), name: w.name.clone() };
    Ok(Answer {
        from: pod(&src),
        to: pod(&dst),
        port: q.port,
        verdict: if detail.allowed { "allow" } else { "deny" },
        mtls,
        source_identity: mtls.then(|| src.identity().to_string()),
        detail,
        waypoints,
    })
}
