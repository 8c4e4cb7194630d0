//! `slipstream debug`: tools for operators and tests that speak to the
//! mesh's data path directly.
//!
//! - [`hbone`]: one HBONE CONNECT with any identity, from any CA, to any
//!   address: "can identity X reach Y through HBONE?".
//! - [`tcp`]: one plain TCP exchange (half-close, read first, write without
//!   reading), through the pod's capture or around it.
//! - [`hold`]: many concurrent echo connections, held open.
//!
//! Each prints what it saw (text, or JSON with `-o json`) and fails with the
//! error, and for HBONE its response flag.

pub mod exchange;
pub mod hbone;
pub mod hold;
pub mod tcp;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpSocket, TcpStream};

pub use hbone::HboneArgs;
pub use hold::HoldArgs;
pub use tcp::TcpArgs;

/// The mark of the node proxy's own sockets: a meshed pod's capture lets
/// them through, so a tool run inside the pod reaches port 15008 itself
/// instead of being carried by the node proxy.
pub const BYPASS_MARK: u32 = slipstream_core::abi::PROXY_MARK;

/// Output format of the debug tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

use slipstream_core::duration::parse_flag;

/// A mark given as decimal or `0x...`.
pub fn parse_mark(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("{s:?} is not a socket mark (decimal or 0x...)"))
}

/// Sizes like `64KiB`, `16MiB`, `1000`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a size (examples: 1000, 64KiB, 16MiB)"))?;
    let mult = match unit {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use KiB, MiB or GiB)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too large"))
}

/// `n` bytes of a recognizable pattern (`abc...z` repeated).
pub fn pattern(n: u64) -> Vec<u8> {
    (0..n).map(|i| b'a' + (i % 26) as u8).collect()
}

/// A TCP connection with `mark` set (0: none), failing after `timeout`.
pub async fn connect(dst: SocketAddr, mark: u32, timeout: Duration) -> io::Result<TcpStream> {
    let domain = if dst.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
    let s = Socket::new(domain, Type::STREAM.nonblocking(), Some(Protocol::TCP))?;
    if mark != 0 {
        s.set_mark(mark).map_err(|e| io::Error::new(e.kind(), format!("setting socket mark {mark:#x} (needs CAP_NET_ADMIN): {e}")))?;
    }
    s.set_tcp_nodelay(true)?;
    let sock = TcpSocket::from_std_stream(s.into());
    match tokio::time::timeout(timeout, sock.connect(dst)).await {
        Ok(r) => r.map_err(|e| io::Error::new(e.kind(), format!("connect to {dst}: {e}"))),
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, format!("connect to {dst} timed out after {timeout:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_flags() {
        assert_eq!(parse_flag("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_flag("2"), Ok(Duration::from_secs(2)));
        assert!(parse_flag("2d").is_err());
        assert_eq!(parse_mark("0x539"), Ok(0x539));
        assert_eq!(parse_mark("273"), Ok(273));
        assert!(parse_mark("x").is_err());
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("3"), Ok(3));
        assert!(parse_size("3 furlongs").is_err());
        assert_eq!(pattern(28), b"abcdefghijklmnopqrstuvwxyzab");
    }
}
