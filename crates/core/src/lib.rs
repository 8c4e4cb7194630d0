//! The mesh model, shaped like Istio's ambient workload API
//! (`istio.workload.Workload`/`Service`, shared/PROTOCOLS.md section 4), and
//! the index the node proxy decides with. Pure: no I/O, no protobuf, no
//! Kubernetes; the control plane and the local cluster both produce it.
#![forbid(unsafe_code)]

pub mod policy;
pub mod spiffe;
pub mod state;
pub mod workload;

pub use spiffe::{SpiffeId, SpiffeIdError, TrustDomain, SPIFFE_PREFIX};
pub use state::{Destination, MeshState};
pub use workload::*;

// The in-pod listeners' ports (15001, 15006, 15008) and their one list,
// `PROXY_PORTS`, are in `workload`. The admin ports below listen in the
// node's namespace, never in a pod's: a pod's `<own IP>:15020` reaches the
// pod's app, not the proxy, so no data-path rule lists them.

/// The node proxy's admin server (`/config_dump`), in the node's namespace.
pub const ADMIN_PORT: u16 = 15000;
/// The node proxy's Prometheus metrics, in the node's namespace.
pub const STATS_PORT: u16 = 15020;
/// The node proxy's readiness endpoint, in the node's namespace.
pub const READINESS_PORT: u16 = 15021;

/// The `tracing` target of log lines their emitter already limits per
/// source (the node proxy's refusal lines and its "N more refusals not
/// logged" summaries). The per-call-site limiter of the long-running
/// processes (`slipstream_testbed::logging`) lets these through: one
/// flooding source must not use up a call site's lines and hide another
/// source's refusals.
pub const PER_SOURCE_LOG_TARGET: &str = "slipstream::per_source";
