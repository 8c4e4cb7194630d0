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
