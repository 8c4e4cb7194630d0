//! The set-up of a mesh process (`slipstream node`, `slipstream waypoint`,
//! `slipstream control`), before its runtime starts: diagnostics to stderr
//! with repeated lines rate-limited per call site ([`logging`]), and the
//! process made non-dumpable ([`make_non_dumpable`]). The local cluster's
//! agent sets itself up the same way, through the test bed.

pub mod logging;

pub use logging::{init, init_with_writer};

/// Makes this process non-dumpable: no core dumps, and a process of the same
/// uid without CAP_SYS_PTRACE (a root pod) can neither read its memory nor
/// reach its files through /proc/PID/{mem,root,fd,environ}. For the
/// processes that hold the mesh's keys: the node proxies, the waypoints,
/// the control plane (and the local cluster's agent).
pub fn make_non_dumpable() -> std::io::Result<()> {
    Ok(rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?)
}
