//! The local cluster that `slipstream up` builds, and that tests use.
//!
//! Pure planning (`plan`, `names`) is separate from the code that changes the
//! machine (`sys`), and the agent (`agent`, a set of controllers) joins the
//! two. `cluster` is the cluster as `up` and `down` see it: made and removed
//! whole. System calls go
//! through rustix; `unsafe` (the workspace denies it) is allowed only in
//! `sys::spawn` (the pre-exec steps that put a process into a pod),
//! `sys::podinit` and `sys::signals`, for the libc calls rustix does not
//! cover and for raw fds handed across fork and exec.

pub mod agent;
pub mod cluster;
pub mod ipc;
pub mod logrotate;
pub mod names;
pub mod plan;
pub mod status;
pub mod sweep;
pub mod sys;

pub use names::{ClusterName, Paths};
/// The agent logs as the mesh's processes do (the shared process set-up).
pub use slipstream_proxy::process::logging;
