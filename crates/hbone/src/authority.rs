//! The `:authority` of an HBONE CONNECT: `ip:port`, IPv6 in brackets.

use std::net::{IpAddr, SocketAddr};

/// Formats `addr` as an authority. Unlike `SocketAddr`'s `Display`, never
/// includes an IPv6 scope id (meaningless to the peer).
pub fn format_authority(addr: SocketAddr) -> String {
    match addr.ip() {
        IpAddr::V4(ip) => format!("{ip}:{}", addr.port()),
        IpAddr::V6(ip) => format!("[{ip}]:{}", addr.port()),
    }
}

/// Parses an authority that must be an IP literal with a port. Host names,
/// missing ports, port 0 and scope ids are refused: HBONE targets are always
/// addresses.
pub fn parse_authority(authority: &str) -> Option<SocketAddr> {
    let addr: SocketAddr = authority.parse().ok()?;
    if addr.port() == 0 {
        return None;
    }
    if let SocketAddr::V6(v6) = addr {
        if v6.scope_id() != 0 || v6.flowinfo() != 0 {
            return None;
        }
    }
    Some(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for s in ["10.1.2.3:8080", "[fd00::1]:80", "[::1]:15008", "127.0.0.1:1"] {
            let addr = parse_authority(s).unwrap();
            assert_eq!(format_authority(addr), s);
        }
    }

    #[test]
    fn rejects_non_addresses() {
        for s in ["", "example.com:80", "10.0.0.1", "10.0.0.1:0", "fd00::1:80", "[fe80::1%2]:80", "10.0.0.1:99999", "http://10.0.0.1:80"] {
            assert_eq!(parse_authority(s), None, "{s}");
        }
    }
}
