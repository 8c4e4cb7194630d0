//! Sockets inside another network namespace. A socket belongs to the
//! namespace it was created in, so only `socket()` needs to run there: the
//! calling thread enters the pod's namespace, creates the socket and returns
//! to the host's namespace at once (two setns calls, microseconds).
#![allow(unsafe_code)]

use socket2::{Domain, Protocol, Socket, Type};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::OnceLock;

/// The namespace the proxy was started in, opened once.
fn host_netns() -> io::Result<&'static File> {
    static HOST: OnceLock<Result<File, String>> = OnceLock::new();
    HOST.get_or_init(|| File::open("/proc/self/ns/net").map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| io::Error::other(format!("cannot open the host network namespace: {e}")))
}

/// An open handle on a network namespace: it stays valid even if the name
/// under /run/netns is removed.
#[derive(Debug)]
pub struct Netns {
    file: File,
    pub path: String,
}

impl Netns {
    pub fn open(path: &Path) -> io::Result<Netns> {
        host_netns()?;
        Ok(Netns { file: File::open(path)?, path: path.display().to_string() })
    }

    /// A new TCP socket that lives in this namespace.
    pub fn tcp_socket(&self, domain: Domain) -> io::Result<Socket> {
        let host = host_netns()?;
        // SAFETY: setns has no memory-safety preconditions; both fds are
        // open for the duration of the calls.
        if unsafe { libc::setns(self.file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let socket = Socket::new(domain, Type::STREAM.nonblocking(), Some(Protocol::TCP));
        // Return to the host namespace whatever happened; if that fails the
        // thread would be stranded in the pod, which must never go unnoticed.
        if unsafe { libc::setns(host.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            let e = io::Error::last_os_error();
            panic!("cannot return to the host network namespace: {e}");
        }
        socket
    }
}
