//! What carrying out one request reads besides the request itself, in one
//! value: what forwarding, mirrors and the endpoint's policies are given.

use crate::fair::BodyActivity;
use crate::peer::Peer;
use crate::plan;
use crate::Shared;
use slipstream_core::route::RequestView;
use slipstream_core::MeshState;
use std::sync::Arc;

/// What forwarding one request reads besides the request itself: the
/// waypoint, the mesh snapshot it was decided over, who sent it and what
/// the policies see of it.
#[derive(Clone, Copy)]
pub struct Call<'a> {
    pub shared: &'a Arc<Shared>,
    pub state: &'a MeshState,
    pub peer: &'a Peer,
    pub caller: plan::Caller<'a>,
    pub view: RequestView<'a>,
    /// The `Host` or `:authority` the client sent.
    pub host: &'a str,
    /// Its `x-request-id`.
    pub id: &'a str,
    /// Its body's activity (the request-body timeout).
    pub activity: &'a BodyActivity,
}
