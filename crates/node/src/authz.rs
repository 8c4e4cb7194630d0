//! Authorization of inbound connections as a pure function of one mesh
//! snapshot and what the connection proved about itself: the core policy
//! engine's ingress decision (network-policy layer and Istio layer, see
//! docs/authorization.md) for the destination workload. Used when a
//! connection arrives and again, for every open connection, after a policy
//! change.

use slipstream_core::policy::engine::{self, Connection};
use slipstream_core::policy::network::L4Protocol;
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
    pub result: Result<(), Arc<str>>,
    pub dry_run: Vec<String>,
}

pub fn authorize(state: &MeshState, dst: &MeshWorkload, c: Conn<'_>) -> Verdict {
    let conn = Connection { protocol: L4Protocol::Tcp, src_ip: c.src.ip(), peer: c.peer, dst_ip: c.dst.ip(), dst_port: c.dst.port() };
    let v = engine::ingress(state, dst, &conn);
    let result = match v.denial() {
        None => Ok(()),
        Some(l) => Err(denial_text(l, std::ptr::eq(l, &v.network)).into()),
    };
    Verdict { result, dry_run: v.dry_run.iter().map(|p| p.to_string()).collect() }
}

/// `network policy: denied by NetworkPolicy ns/name spec.ingress[0]` or
/// `authorization: no allow rule matched (AuthorizationPolicy ns/name)`.
pub fn denial_text(l: &LayerVerdict, network: bool) -> String {
    format!("{}: {}", if network { "network policy" } else { "authorization" }, l.explain())
}

/// [`authorize`] for a connection to the workload `dst_uid`; a destination
/// the snapshot does not know is denied (fail closed).
pub fn authorize_uid(state: &MeshState, dst_uid: &str, c: Conn<'_>) -> Verdict {
    match state.workload(dst_uid) {
        Some(w) => authorize(state, &w, c),
        None => Verdict { result: Err(format!("workload {dst_uid} is not in the mesh configuration").into()), dry_run: Vec::new() },
    }
}
