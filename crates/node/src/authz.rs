//! Authorization of inbound connections: the applicable policies of the
//! destination workload (shared/PROTOCOLS.md section 4) over what the
//! connection proved about itself. Fails closed: a destination the proxy
//! cannot find is denied.

use crate::proxy::Shared;
use slipstream_core::policy::{check, ConnAttrs, Decision};
use std::net::SocketAddr;

/// Ok, or the reason for the denial. `principal` is the verified peer
/// identity without `spiffe://` (None for plaintext).
pub fn authorize(shared: &Shared, dst_uid: &str, principal: Option<&str>, src: SocketAddr, dst: SocketAddr) -> Result<(), String> {
    let snap = shared.snapshot.borrow().clone();
    let Some(w) = snap.mesh.workload(dst_uid) else {
        return Err(format!("workload {dst_uid} is not in the mesh configuration"));
    };
    let policies = snap.mesh.policies_for(&w);
    if policies.is_empty() {
        return Ok(());
    }
    let namespace = principal.and_then(|p| p.split('/').nth(2));
    let attrs = ConnAttrs { principal, namespace, source_ip: src.ip(), destination_ip: dst.ip(), destination_port: dst.port() };
    let mut dry = Vec::new();
    let d = check(policies.iter().map(|p| p.as_ref()), &attrs, &mut dry);
    for p in dry {
        tracing::info!(policy = %p, src = %src, dst = %dst, principal = principal.unwrap_or("-"), "dry-run policy matched");
    }
    match d {
        Decision::Allow => Ok(()),
        Decision::Deny(why) => Err(why),
    }
}
