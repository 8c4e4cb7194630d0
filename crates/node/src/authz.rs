//! Authorization of inbound connections as a pure function of one mesh
//! snapshot and what the connection proved about itself: the applicable
//! policies of the destination workload (shared/PROTOCOLS.md section 4).
//! Used when a connection arrives and again, for every open connection,
//! after a policy change.

use slipstream_core::policy::{check, Authorization, ConnAttrs, Decision};
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
/// caller; they never decide).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub result: Result<(), Arc<str>>,
    pub dry_run: Vec<String>,
}

pub fn authorize(state: &MeshState, dst: &MeshWorkload, c: Conn<'_>) -> Verdict {
    Policies::of(state, dst).check(c)
}

/// [`authorize`] for a connection to the workload `dst_uid`; a destination
/// the snapshot does not know is denied (fail closed).
pub fn authorize_uid(state: &MeshState, dst_uid: &str, c: Conn<'_>) -> Verdict {
    Policies::of_uid(state, dst_uid).check(c)
}

/// The policies that apply to one destination, found once: a policy change
/// re-checks every open connection of a pod with one lookup, not one per
/// connection.
#[derive(Debug, Clone)]
pub struct Policies {
    /// Err: the destination is not in the snapshot (fail closed).
    applicable: Result<Vec<Arc<Authorization>>, Arc<str>>,
}

impl Policies {
    pub fn of(state: &MeshState, dst: &MeshWorkload) -> Policies {
        Policies { applicable: Ok(state.policies_for(dst)) }
    }

    pub fn of_uid(state: &MeshState, dst_uid: &str) -> Policies {
        match state.workload(dst_uid) {
            Some(w) => Policies::of(state, &w),
            None => Policies { applicable: Err(format!("workload {dst_uid} is not in the mesh configuration").into()) },
        }
    }

    pub fn check(&self, c: Conn<'_>) -> Verdict {
        let policies = match &self.applicable {
            Err(why) => return Verdict { result: Err(why.clone()), dry_run: Vec::new() },
            Ok(p) if p.is_empty() => return Verdict { result: Ok(()), dry_run: Vec::new() },
            Ok(p) => p,
        };
        let principal = c.peer.map(SpiffeId::principal);
        let attrs = ConnAttrs {
            principal: principal.as_deref(),
            namespace: c.peer.map(SpiffeId::namespace),
            source_ip: c.src.ip(),
            destination_ip: c.dst.ip(),
            destination_port: c.dst.port(),
        };
        let mut dry_run = Vec::new();
        let result = match check(policies.iter().map(|p| p.as_ref()), &attrs, &mut dry_run) {
            Decision::Allow => Ok(()),
            Decision::Deny(why) => Err(Arc::from(why)),
        };
        Verdict { result, dry_run }
    }
}
