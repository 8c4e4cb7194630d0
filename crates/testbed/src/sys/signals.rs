//! Signals: sending them, and a termination flag for the agent's loop.

use std::sync::atomic::{AtomicBool, Ordering};

static TERMINATE: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    TERMINATE.store(true, Ordering::SeqCst);
}

/// Sets SIGTERM/SIGINT to raise the flag read by `terminate_requested`.
pub fn install_termination_flag() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, on_term as extern "C" fn(libc::c_int) as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_term as extern "C" fn(libc::c_int) as libc::sighandler_t);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

pub fn terminate_requested() -> bool {
    TERMINATE.load(Ordering::SeqCst)
}

pub fn kill(pid: i32, sig: i32) -> std::io::Result<()> {
    // SAFETY: kill(2) has no memory-safety preconditions.
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether a process exists (and is not a zombie we could not see as such).
pub fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s.rsplit_once(')').map(|(_, r)| r.trim_start().starts_with('Z')).unwrap_or(false),
        Err(_) => false,
    }
}
