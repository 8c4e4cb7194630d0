//! The open-file limit. A node proxy holds two sockets per proxied
//! connection on some paths (the pod's and the upstream), so the default
//! soft limit of 1024 would cap it at a few hundred connections.
#![allow(unsafe_code)]

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

fn get() -> io::Result<libc::rlimit> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(lim)
}

/// RLIMIT_NOFILE as it is.
pub fn current() -> io::Result<NofileLimit> {
    let l = get()?;
    Ok(NofileLimit { before: l.rlim_cur as u64, soft: l.rlim_cur as u64, hard: l.rlim_max as u64 })
}

/// Raises the soft open-file limit to the hard limit.
pub fn raise_nofile() -> io::Result<NofileLimit> {
    let mut lim = get()?;
    let before = lim.rlim_cur as u64;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit reads one rlimit from a struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let now = get()?;
    Ok(NofileLimit { before, soft: now.rlim_cur as u64, hard: now.rlim_max as u64 })
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
