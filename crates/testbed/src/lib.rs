//! The local cluster that `slipstream up` builds, and that tests use.
//!
//! Pure planning (`plan`, `names`) is separate from the code that changes the
//! machine (`sys`), and the agent (`agent`) joins the two. `unsafe` is
//! confined to `sys::spawn` (the pre-exec steps that put a process into a
//! pod) and `sys::signals`.

pub mod agent;
pub mod ipc;
pub mod logging;
pub mod names;
pub mod plan;
pub mod status;
pub mod sweep;
pub mod sys;

pub use names::{ClusterName, Paths};
