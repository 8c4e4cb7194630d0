//! Sockets inside another network namespace. A socket belongs to the
//! namespace it was created in, so only `socket()` needs to run there: the
//! calling thread enters the pod's namespace, creates the socket and returns
//! to the host's namespace at once (two setns calls, microseconds), through
//! rustix's safe `setns`.

use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};
use socket2::{Domain, Protocol, Socket, Type};
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
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
        move_into_link_name_space(self.file.as_fd(), Some(LinkNameSpaceType::Network))?;
        let socket = Socket::new(domain, Type::STREAM.nonblocking(), Some(Protocol::TCP));
        // Return to the host namespace whatever happened; if that fails the
        // thread would be stranded in the pod, which must never go unnoticed.
        if let Err(e) = move_into_link_name_space(host.as_fd(), Some(LinkNameSpaceType::Network)) {
            panic!("cannot return to the host network namespace: {e}");
        }
        socket
    }
}
