//! The caller of one tunnel: its verified identity and its address, for
//! every request on it (what the handler learns from HBONE, and what the
//! request path and the TCP path decide by).

use slipstream_core::SpiffeId;
use std::net::SocketAddr;

/// The caller of one tunnel, for every request on it.
#[derive(Debug, Clone)]
pub struct Peer {
    pub identity: SpiffeId,
    pub addr: SocketAddr,
}
