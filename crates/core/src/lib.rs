//! The mesh model, shaped like Istio's ambient workload API
//! (`istio.workload.Workload`/`Service`, shared/PROTOCOLS.md section 4), and
//! the index the node proxy decides with. Pure: no I/O, no protobuf, no
//! Kubernetes; the control plane and the local cluster both produce it.
#![forbid(unsafe_code)]

pub mod policy;
pub mod state;
pub mod workload;

pub use state::{Destination, MeshState};
pub use workload::*;

/// The node proxy's admin server (`/config_dump`), in the node's namespace.
pub const ADMIN_PORT: u16 = 15000;
/// The node proxy's Prometheus metrics, in the node's namespace.
pub const STATS_PORT: u16 = 15020;
/// The node proxy's readiness endpoint, in the node's namespace.
pub const READINESS_PORT: u16 = 15021;
/// Every port the node proxy listens on: the in-pod listeners and the admin
/// ports. A connection to one of them on a local address would loop back
/// into the proxy (or reach it from a pod), so the data path refuses it.
pub const NODE_PROXY_PORTS: [u16; 6] = [OUTBOUND_PORT, INBOUND_PLAINTEXT_PORT, HBONE_PORT, ADMIN_PORT, STATS_PORT, READINESS_PORT];
