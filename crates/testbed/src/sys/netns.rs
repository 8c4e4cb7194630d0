//! Running a closure inside a network namespace: on a fresh thread, because
//! setns(2) changes only the calling thread and we must not move the
//! caller's.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

pub fn in_netns<T: Send + 'static>(netns: &Path, f: impl FnOnce() -> T + Send + 'static) -> std::io::Result<T> {
    let file = File::open(netns)?;
    std::thread::spawn(move || {
        // SAFETY: setns on this thread only; the fd is valid for the call.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(f())
    })
    .join()
    .map_err(|_| std::io::Error::other("thread running in a network namespace panicked"))?
}
