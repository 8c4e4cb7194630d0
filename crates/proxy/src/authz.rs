//! Authorization of inbound connections as a pure function of one mesh
//! snapshot and what the connection proved about itself: the core policy
//! engine's ingress decision (network-policy layer and Istio layer, see
//! docs/authorization.md) for the destination workload. Used when a
//! connection arrives and again, for every open connection, after a policy
//! change.

use crate::denial::Denial;
use slipstream_core::engine::{self, Connection};
use slipstream_core::policy::network::{Direction, L4Protocol};
use slipstream_core::policy::LayerVerdict;
use slipstream_core::{MeshState, MeshWorkload, SpiffeId};
use std::net::SocketAddr;
use std::sync::Arc;

/// What an inbound connection proved: the verified peer identity (None for
/// plaintext) and its addresses.
#[derive(Debug, Clone, Copy)]
pub struct Conn<'a> {
    pub peer: Option<&'a SpiffeId>,
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

/// The verdict, and the dry-run policies that matched (logged by the
/// caller; they never decide). A denial's text names the layer and the
/// deciding policy and rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub result: Result<(), Arc<Denial>>,
    pub dry_run: Vec<String>,
}

pub fn authorize(state: &MeshState, dst: &MeshWorkload, c: Conn<'_>) -> Verdict {
    let conn = Connection { protocol: L4Protocol::Tcp, src_ip: c.src.ip(), peer: c.peer, dst_ip: c.dst.ip(), dst_port: c.dst.port() };
    let v = engine::ingress(state, dst, &conn);
    let result = match v.denial() {
        None => Ok(()),
        Some(l) => Err(denial(l, std::ptr::eq(l, &v.network))),
    };
    Verdict { result, dry_run: v.dry_run.iter().map(|p| p.to_string()).collect() }
}

/// The refusal of a layer that denied: its text is `network policy:
/// denied by NetworkPolicy ns/name spec.ingress[0]` or `authorization: no
/// allow rule matched (AuthorizationPolicy ns/name)`.
pub fn denial(l: &LayerVerdict, network: bool) -> Arc<Denial> {
    let (layer, label) = if network { ("network_policy", "network policy") } else { ("authorization", "authorization") };
    let by = l.by.clone().or_else(|| l.candidates.first().cloned());
    Arc::new(Denial { text: format!("{label}: {}", l.explain()).into(), layer, by })
}

/// [`authorize`] for a connection to the workload `dst_uid`; a destination
/// the snapshot does not know is denied (fail closed).
pub fn authorize_uid(state: &MeshState, dst_uid: &str, c: Conn<'_>) -> Verdict {
    match state.workload(dst_uid) {
        Some(w) => authorize(state, &w, c),
        None => Verdict { result: Err(Denial::other(format!("workload {dst_uid} is not in the mesh configuration"))), dry_run: Vec::new() },
    }
}

/// The network-policy decision of an outbound connection of `src` to
/// `dst`: the source's egress rules and, for a destination outside the
/// mesh (whose node proxy never sees the connection), the destination's
/// ingress rules. A meshed destination's node proxy decides its own
/// ingress, with the verified identity.
pub fn outbound(state: &MeshState, src: &MeshWorkload, src_addr: SocketAddr, dst: SocketAddr) -> Result<(), Arc<Denial>> {
    let c = Connection { protocol: L4Protocol::Tcp, src_ip: src_addr.ip(), peer: None, dst_ip: dst.ip(), dst_port: dst.port() };
    let v = engine::network(state, src, Direction::Egress, &c);
    if !v.allowed {
        return Err(denial(&v, true));
    }
    if let Some(w) = state.workload_by_ip(dst.ip()).filter(|w| !w.meshed()) {
        let v = engine::network(state, &w, Direction::Ingress, &c);
        if !v.allowed {
            return Err(denial(&v, true));
        }
    }
    Ok(())
}

/// What authorization needs to decide an open connection again.
#[derive(Debug, Clone)]
pub struct AuthzKey {
    /// The verified peer identity; None for plaintext (and outbound).
    pub peer: Option<SpiffeId>,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    /// An outbound connection of the pod (decided by its egress rules),
    /// rather than one it accepts.
    pub outbound: bool,
}

/// Decides an open connection of the pod `uid` again after a change.
pub fn recheck(state: &MeshState, uid: &str, k: &AuthzKey) -> Result<(), Arc<Denial>> {
    if !k.outbound {
        return authorize_uid(state, uid, Conn { peer: k.peer.as_ref(), src: k.src, dst: k.dst }).result;
    }
    match state.workload(uid) {
        Some(w) => outbound(state, &w, k.src, k.dst),
        // The pod left the mesh configuration: its own policies no longer
        // say anything, and the pod's connections are drained elsewhere.
        None => Ok(()),
    }
}
