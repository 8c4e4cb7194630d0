//! The node proxy (`slipstream node`): one per node. It opens listeners
//! inside each meshed pod's network namespace (in-pod mode), carries the
//! pod's outbound TCP connections in HBONE tunnels with the pod's own SPIFFE
//! identity, terminates HBONE for the pod, and records L4 telemetry.
//! See docs/node-proxy.md (behaviour) and docs/node-internals.md (how the
//! modules fit).
//!
//! What it shares with the waypoint, its sibling, is `slipstream_proxy`:
//! the per-source limits, the authorization seam (`authz`, `Denial`), the
//! control plane's channel and its xDS and certificate clients, the
//! certificates' sources, the metric label types, the limit settings and
//! the process set-up. What is here is the node proxy's alone: the in-pod
//! listeners, the eBPF datapath's maps, the kernel path of pods outside
//! the mesh, its telemetry and its errors.
//!
//! `unsafe` is allowed only in `sys` (setns around socket creation, socket
//! options socket2 lacks).
#![deny(unsafe_code)]

// Leaves: no module here imports `state` or anything above it.
pub mod config;
pub mod conns;
pub mod error;
pub mod kernel_drops;
pub mod memtrim;
pub mod netpol;
pub mod ready;
pub mod relay;
pub mod selfcall;
pub mod sockets;
pub mod source;
pub mod sys;
pub mod telemetry;
pub mod testing;

// What every task shares, then the data path and the wiring above it.
pub mod admin;
pub mod inbound;
pub mod inpod;
pub mod outbound;
pub mod proxy;
pub mod state;

pub mod debug;

pub use config::{Config, NodeArgs};
pub use error::ProxyError;
pub use slipstream_hbone::shard;
