//! Signals: sending them, a termination flag for the agent's loop, and the
//! exit code of a process they killed.
//!
//! Still libc: signal(2), to install the handler and to ignore SIGPIPE.
//! rustix offers signal dispositions only to programs that run without libc
//! (`rustix::runtime`); here libc owns them.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};

pub use rustix::process::Signal;

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

/// Sends `sig` to the process `pid` (a positive pid: never a process group
/// or every process, as kill(2) would take 0 or a negative one to mean).
pub fn kill(pid: i32, sig: Signal) -> std::io::Result<()> {
    let pid = (pid > 0)
        .then_some(pid)
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no process {pid}")))?;
    Ok(rustix::process::kill_process(pid, sig)?)
}

/// Stops a child as kubelet stops a container: SIGTERM, up to `grace`
/// for it to exit, then SIGKILL; reaped either way.
pub fn stop_child(child: &mut std::process::Child, grace: std::time::Duration) {
    let _ = kill(child.id() as i32, Signal::TERM);
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
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

/// The exit code that reports `status`: the code, or 128+N for signal N, as
/// a shell reports it (pure).
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    #[test]
    fn exit_codes_as_a_shell_reports_them() {
        // Raw wait statuses: exit code in bits 8-15, signal in bits 0-6.
        for (raw, want) in [(0, 0), (7 << 8, 7), (255 << 8, 255), (9, 137), (15, 143), (6 | 0x80, 134)] {
            assert_eq!(super::exit_code(ExitStatus::from_raw(raw)), want, "raw status {raw:#x}");
        }
    }
}
