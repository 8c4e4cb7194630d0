//! slipstream-hbone: HBONE, Istio ambient's proxy-to-proxy tunnel
//! (docs/protocols.md section 2): each application TCP connection is one HTTP/2
//! CONNECT stream inside mutual TLS to the destination's node proxy on port
//! 15008.
//!
//! - [`Pool`] (client): shares connections per [`PoolKey`], opens
//!   [`TunnelStream`]s.
//! - [`Server`]: certificate per destination IP, client-certificate
//!   verification, the CONNECT checks, and a [`Handler`] for the rest.
//! - [`HboneError`]: every failure with its status code and response flag.

#![forbid(unsafe_code)]

mod authority;
mod chunk;
mod client;
mod coalesce;
mod connector;
pub mod copy;
pub mod drain;
mod error;
mod h2config;
pub mod headers;
mod server;
pub mod shard;
mod stream;

pub use authority::{format_authority, parse_authority};
pub use client::{CertSource, ConnectRequest, ConnectionSnapshot, Pool, PoolConfig, PoolKey, PoolSnapshot};
pub use connector::{Connector, PlainConnector};
pub use error::{Fault, HboneError, ResponseFlag, TimeoutStage};
pub use h2config::{H2Config, MIN_CONNECTION_WINDOW};
pub use server::{
    Admission, AdmissionRefused, CertResolver, ConnectionContext, Handler, HandshakeFailure, HandshakeFailureKind, InPlace, InboundRequest,
    Permit, ResolveError, Server, ServerConfig, ServerStats, StatsSnapshot, StreamRecord, Upstream, UPSTREAM_CONNECT_TIMEOUT,
};
pub use stream::{TunnelReader, TunnelStream, TunnelWriter};
