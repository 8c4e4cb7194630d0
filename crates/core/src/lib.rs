//! The mesh model, shaped like Istio's ambient workload API
//! (`istio.workload.Workload`/`Service`, docs/protocols.md section 4), and
//! the index the node proxy decides with. Pure: no I/O, no protobuf, no
//! Kubernetes; the control plane and the local cluster both produce it.
//!
//! Resources go into [`MeshIndex`] (one mutable owner, validating each as
//! it arrives) and come out as [`MeshState`] snapshots (immutable, cheap to
//! clone); docs/node-internals.md has the picture.
#![forbid(unsafe_code)]

pub mod abi;
pub mod bucket;
pub mod duration;
pub mod engine;
#[cfg(test)]
mod fixtures;
pub mod index;
pub mod log_limit;
pub mod mesh;
pub mod path;
pub mod policy;
pub mod route;
pub mod spiffe;
pub mod state;
pub mod sync;
pub mod workload;

// The ports have always been named from the crate root.
pub use abi::{ADMIN_PORT, HBONE_PORT, INBOUND_PLAINTEXT_PORT, OUTBOUND_PORT, PROXY_PORTS, READINESS_PORT, STATS_PORT};
pub use index::{ApplyReport, Change, MeshConfig, MeshIndex, ResourceError, ResourceKind};
pub use spiffe::{SpiffeId, SpiffeIdError, TrustDomain, SPIFFE_PREFIX};
pub use state::{Destination, Endpoint, MeshService, MeshState, MeshWorkload, WorkloadLabels};
pub use workload::*;

/// The `tracing` target of log lines their emitter already limits per
/// source (the node proxy's refusal lines and its "N more refusals not
/// logged" summaries). The per-call-site limiter of the long-running
/// processes (`slipstream_proxy::process::logging`) lets these through: one
/// flooding source must not use up a call site's lines and hide another
/// source's refusals.
pub const PER_SOURCE_LOG_TARGET: &str = "slipstream::per_source";

/// The `tracing` target of the waypoint's access-log lines: one per
/// request, the record of what happened, so never rate-limited either.
pub const ACCESS_LOG_TARGET: &str = "slipstream::access";
