//! Listener creation and address presentation shared by every app.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use tokio::net::TcpListener;

/// Binds a TCP listener on `ip:port`.
///
/// Binding the IPv6 unspecified address (`::`) gives a dual-stack socket on
/// Linux (`net.ipv6.bindv6only` is 0 by default in every network namespace).
/// Pods of the local cluster may have IPv6 disabled, in which case `::` cannot
/// be bound at all; then we fall back to `0.0.0.0` so the default `--bind`
/// works everywhere. A port conflict is never papered over: it is returned as
/// is so startup fails loudly.
pub async fn bind_listener(ip: IpAddr, port: u16) -> io::Result<TcpListener> {
    let addr = SocketAddr::new(ip, port);
    match TcpListener::bind(addr).await {
        Ok(listener) => Ok(listener),
        Err(err) if ip == IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED) && ipv6_unavailable(&err) => {
            let fallback = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
            TcpListener::bind(fallback)
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("bind {fallback} (after {addr} failed: {err}): {e}")))
        }
        Err(err) => Err(io::Error::new(err.kind(), format!("bind {addr}: {err}"))),
    }
}

/// True for the errors a kernel gives when IPv6 is disabled or absent, as
/// opposed to a real conflict (address in use, permission denied).
fn ipv6_unavailable(err: &io::Error) -> bool {
    const EAFNOSUPPORT: i32 = 97;
    const EADDRNOTAVAIL: i32 = 99;
    matches!(err.kind(), io::ErrorKind::AddrNotAvailable | io::ErrorKind::Unsupported)
        || matches!(err.raw_os_error(), Some(EAFNOSUPPORT | EADDRNOTAVAIL))
}

/// Presents an address the way the peer itself would write it: an IPv4 client
/// of a dual-stack socket shows up as `::ffff:a.b.c.d`, which would make
/// "the server saw the client pod's IP" checks compare unequal for no reason.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_ipv4_is_shown_as_ipv4() {
        let mapped: SocketAddr = "[::ffff:10.1.2.3]:4000".parse().unwrap();
        assert_eq!(canonical(mapped).to_string(), "10.1.2.3:4000");
        let v6: SocketAddr = "[fd00::1]:80".parse().unwrap();
        assert_eq!(canonical(v6), v6);
    }

    #[test]
    fn only_address_family_errors_trigger_the_fallback() {
        assert!(ipv6_unavailable(&io::Error::from_raw_os_error(97)));
        assert!(ipv6_unavailable(&io::Error::from_raw_os_error(99)));
        assert!(!ipv6_unavailable(&io::Error::from(io::ErrorKind::AddrInUse)));
        assert!(!ipv6_unavailable(&io::Error::from(io::ErrorKind::PermissionDenied)));
    }

    #[tokio::test]
    async fn port_conflicts_are_reported_not_hidden() {
        let first = bind_listener("127.0.0.1".parse().unwrap(), 0).await.unwrap();
        let port = first.local_addr().unwrap().port();
        let err = bind_listener("127.0.0.1".parse().unwrap(), port).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        assert!(err.to_string().contains(&port.to_string()), "{err}");
    }
}
