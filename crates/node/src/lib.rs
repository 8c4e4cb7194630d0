//! The node proxy (`slipstream node`): one per node. It opens listeners
//! inside each meshed pod's network namespace (in-pod mode), carries the
//! pod's outbound TCP connections in HBONE tunnels with the pod's own SPIFFE
//! identity, terminates HBONE for the pod, and records L4 telemetry.
//! See docs/node-proxy.md.
//!
//! `unsafe` is allowed only in `sys` (setns around socket creation, the
//! open-file limit, socket options socket2 lacks, malloc_trim).
#![deny(unsafe_code)]

pub mod accesslog;
pub mod admin;
pub mod authz;
pub mod config;
pub mod conn;
pub mod debug;
pub mod inbound;
pub mod inpod;
pub mod limits;
pub mod memtrim;
pub mod metrics;
pub mod outbound;
pub mod proxy;
pub mod refusals;
pub mod selfcall;
pub mod sockets;
pub mod sys;
pub mod tracker;
pub mod watch;

pub use config::{Config, NodeArgs};
