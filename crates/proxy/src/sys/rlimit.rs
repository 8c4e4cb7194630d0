//! The open-file limit. A node proxy holds two sockets per proxied
//! connection on some paths (the pod's and the upstream), so the default
//! soft limit of 1024 would cap it at a few hundred connections.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use std::io;

/// RLIMIT_NOFILE before and after [`raise_nofile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimit {
    /// The soft limit found at start.
    pub before: u64,
    /// The soft limit now in force.
    pub soft: u64,
    /// The hard limit (the ceiling an unprivileged raise can reach).
    pub hard: u64,
}

/// `None` is RLIM_INFINITY.
fn value(v: Option<u64>) -> u64 {
    v.unwrap_or(u64::MAX)
}

/// RLIMIT_NOFILE as it is.
pub fn current() -> io::Result<NofileLimit> {
    let l = getrlimit(Resource::Nofile);
    Ok(NofileLimit { before: value(l.current), soft: value(l.current), hard: value(l.maximum) })
}

/// Raises the soft open-file limit to the hard limit.
pub fn raise_nofile() -> io::Result<NofileLimit> {
    let l = getrlimit(Resource::Nofile);
    let before = value(l.current);
    if l.current != l.maximum {
        setrlimit(Resource::Nofile, Rlimit { current: l.maximum, maximum: l.maximum })?;
    }
    let now = getrlimit(Resource::Nofile);
    Ok(NofileLimit { before, soft: value(now.current), hard: value(now.maximum) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn raises_to_the_hard_limit() {
        let l = super::raise_nofile().unwrap();
        assert_eq!(l.soft, l.hard);
        assert!(l.soft >= l.before);
    }
}
