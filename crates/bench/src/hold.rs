//! R1's connection holder: opens many TCP connections from inside the
//! client pod's network namespace (a socket belongs to the namespace it was
//! created in, so worker threads enter it just to create their sockets),
//! checks each one end to end with a one-byte echo, and keeps them open.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A worker gives up after this many failures in a row (the path is down,
/// or out of file descriptors): the run reports how many were held.
const MAX_FAILURES_IN_A_ROW: usize = 20;

pub struct Held {
    pub streams: Vec<TcpStream>,
    pub failed: usize,
    pub first_error: Option<String>,
    pub open_s: f64,
}

impl Held {
    /// Closes every connection with a reset (SO_LINGER 0), so that the
    /// client pod is not left with thousands of TIME_WAIT sockets holding
    /// its ephemeral ports for the next repetition.
    pub fn release(self) -> usize {
        let n = self.streams.len();
        for s in self.streams {
            let _ = rustix::net::sockopt::set_socket_linger(&s, Some(Duration::ZERO));
        }
        n
    }
}

/// What one worker thread opened.
struct Share {
    streams: Vec<TcpStream>,
    failed: usize,
    first_error: Option<String>,
}

fn enter_netns(netns: &Path) -> std::io::Result<()> {
    let f = std::fs::File::open(netns)?;
    rustix::thread::move_into_link_name_space(std::os::fd::AsFd::as_fd(&f), Some(rustix::thread::LinkNameSpaceType::Network))?;
    Ok(())
}

fn one(target: SocketAddr) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT)?;
    s.set_read_timeout(Some(CONNECT_TIMEOUT))?;
    s.write_all(b"x")?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    if b != *b"x" {
        return Err(std::io::Error::other("the echo returned a different byte"));
    }
    s.set_read_timeout(None)?;
    Ok(s)
}

/// Opens `count` connections to `target` from the network namespace at
/// `netns`, with `workers` threads; stops early when `stop()` says so.
pub fn open(netns: &Path, target: SocketAddr, count: usize, workers: usize, stop: &(dyn Fn() -> bool + Sync)) -> std::io::Result<Held> {
    let t0 = Instant::now();
    let workers = workers.clamp(1, count.max(1));
    let results: Vec<std::io::Result<Share>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let n = count / workers + usize::from(w < count % workers);
                scope.spawn(move || {
                    enter_netns(netns)?;
                    let mut share = Share { streams: Vec::with_capacity(n), failed: 0, first_error: None };
                    let mut in_a_row = 0;
                    while share.streams.len() < n && in_a_row < MAX_FAILURES_IN_A_ROW && !stop() {
                        match one(target) {
                            Ok(s) => {
                                share.streams.push(s);
                                in_a_row = 0;
                            }
                            Err(e) => {
                                share.failed += 1;
                                in_a_row += 1;
                                share.first_error.get_or_insert_with(|| e.to_string());
                            }
                        }
                    }
                    Ok(share)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("a holder thread panicked")))).collect()
    });
    let mut held = Held { streams: Vec::with_capacity(count), failed: 0, first_error: None, open_s: 0.0 };
    for r in results {
        let share = r?;
        held.streams.extend(share.streams);
        held.failed += share.failed;
        if held.first_error.is_none() {
            held.first_error = share.first_error;
        }
    }
    held.open_s = t0.elapsed().as_secs_f64();
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A loopback echo server; the holder "enters" the namespace it is
    /// already in (needs root for setns, so only when root).
    #[test]
    fn holds_connections_to_an_echo_server() {
        let root = std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
        if !root {
            eprintln!("skipped: setns needs root (covered by the cluster test)");
            return;
        }
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut s = s;
                    let mut b = [0u8; 1];
                    while s.read_exact(&mut b).is_ok() && s.write_all(&b).is_ok() {}
                });
            }
        });
        let held = open(Path::new("/proc/self/ns/net"), addr, 50, 4, &|| false).unwrap();
        assert_eq!((held.streams.len(), held.failed), (50, 0));
        let none = open(Path::new("/proc/self/ns/net"), "127.0.0.1:1".parse().unwrap(), 5, 2, &|| false).unwrap();
        assert_eq!(none.streams.len(), 0);
        assert!(none.first_error.unwrap().contains("refused"));
    }
}
