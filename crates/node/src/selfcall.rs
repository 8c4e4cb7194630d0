//! The one rule against connections that loop back into the node proxy.
//!
//! Capture never redirects a connection to a local destination (the pod's
//! nftables return early for `lo` and for `fib daddr type local`), so a
//! connection on the outbound listener whose original destination is local
//! (loopback, unspecified, one of the pod's own addresses) was made straight
//! to the listener by the pod: passing it through would dial the proxy
//! itself, again and again. Inbound, the destination is always the pod's own
//! address; there a target port that is one of the proxy's in-pod listeners
//! (`slipstream_core::PROXY_PORTS`: 15001, 15006, 15008, docs/protocols.md
//! section 2) would reach the proxy instead of the app. The admin ports
//! (15000, 15020, 15021) listen in the node's namespace, not the pod's: a
//! pod's own address on those ports is the app's, so inbound they pass.

use slipstream_core::PROXY_PORTS;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// Why a destination would loop back into the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelfCall {
    /// Outbound to a loopback address (127.0.0.0/8, ::1, IPv4-mapped too).
    Loopback(SocketAddr),
    /// Outbound to 0.0.0.0 or :: (which the kernel treats as local).
    Unspecified(SocketAddr),
    /// Outbound to one of the pod's own addresses.
    OwnAddress(SocketAddr),
    /// One of the proxy's in-pod listener ports on a local address.
    ProxyPort(SocketAddr),
}

impl fmt::Display for SelfCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ProxyPort(a) => write!(f, "self-call refused: {a} is one of the node proxy's own ports on a local address"),
            Self::Loopback(a) => write!(f, "self-call refused: {a} is a loopback address, which capture never redirects"),
            Self::Unspecified(a) => write!(f, "self-call refused: {a} is the unspecified address (local), which capture never redirects"),
            Self::OwnAddress(a) => write!(f, "self-call refused: {a} is the pod's own address, which capture never redirects"),
        }
    }
}

impl SelfCall {
    /// The destination that would loop.
    pub fn addr(&self) -> SocketAddr {
        match *self {
            Self::Loopback(a) | Self::Unspecified(a) | Self::OwnAddress(a) | Self::ProxyPort(a) => a,
        }
    }
}

/// Where the connection was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// On the outbound listener (:15001): every local destination refused.
    Outbound,
    /// On :15006 or as an HBONE target: the in-pod listener ports refused.
    Inbound,
}

/// Whether `dst` loops back into the proxy; `own` are the pod's addresses.
pub fn self_call(side: Side, dst: SocketAddr, own: &[IpAddr]) -> Option<SelfCall> {
    self_call_in(side, dst, own, true)
}

/// [`self_call`] where loopback addresses may not be local: the in-process
/// test tier's pods are addresses in 127.0.0.0/8 (`testing`), so there a
/// loopback destination is another pod, and only the pod's own addresses,
/// the unspecified address and the proxy ports count. Every real socket
/// factory says loopback is local.
pub fn self_call_in(side: Side, dst: SocketAddr, own: &[IpAddr], loopback_is_local: bool) -> Option<SelfCall> {
    let ip = dst.ip().to_canonical();
    let local = if loopback_is_local && ip.is_loopback() {
        Some(SelfCall::Loopback(dst))
    } else if ip.is_unspecified() {
        Some(SelfCall::Unspecified(dst))
    } else if own.iter().any(|o| o.to_canonical() == ip) {
        Some(SelfCall::OwnAddress(dst))
    } else {
        None
    };
    let proxy_port = PROXY_PORTS.contains(&dst.port());
    match (side, local) {
        (_, Some(_)) if proxy_port => Some(SelfCall::ProxyPort(dst)),
        (Side::Outbound, local) => local,
        // Inbound destinations are the pod's own: only the port matters.
        (Side::Inbound, _) => proxy_port.then_some(SelfCall::ProxyPort(dst)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_as_a_table() {
        let own: Vec<IpAddr> = vec!["10.244.1.5".parse().unwrap()];
        use SelfCall::*;
        use Side::*;
        let a = |s: &str| -> SocketAddr { s.parse().unwrap() };
        type Expected = Option<fn(SocketAddr) -> SelfCall>;
        let cases: &[(Side, &str, Expected)] = &[
            (Outbound, "127.0.0.1:15001", Some(ProxyPort)),
            (Outbound, "127.0.0.2:15001", Some(ProxyPort)),
            (Outbound, "127.0.0.1:8080", Some(Loopback)),
            (Outbound, "127.1.2.3:80", Some(Loopback)),
            (Outbound, "[::1]:15001", Some(ProxyPort)),
            (Outbound, "[::1]:80", Some(Loopback)),
            (Outbound, "[::ffff:127.0.0.1]:15001", Some(ProxyPort)),
            (Outbound, "[::ffff:127.0.0.1]:9", Some(Loopback)),
            (Outbound, "0.0.0.0:15001", Some(ProxyPort)),
            (Outbound, "0.0.0.0:80", Some(Unspecified)),
            (Outbound, "[::]:80", Some(Unspecified)),
            (Outbound, "10.244.1.5:15006", Some(ProxyPort)),
            (Outbound, "10.244.1.5:15008", Some(ProxyPort)),
            // The admin ports are not in the pod: a local address on them
            // is refused as local, not as a proxy port.
            (Outbound, "10.244.1.5:15020", Some(OwnAddress)),
            (Outbound, "127.0.0.1:15021", Some(Loopback)),
            (Outbound, "10.244.1.5:8080", Some(OwnAddress)),
            (Outbound, "[::ffff:10.244.1.5]:8080", Some(OwnAddress)),
            // Another pod, the node, outside: never a self-call, whatever
            // the port (a node's :15020 is its metrics, reachable as in
            // Kubernetes).
            (Outbound, "10.244.2.7:15008", None),
            (Outbound, "10.244.1.1:15020", None),
            (Outbound, "192.0.2.1:443", None),
            (Outbound, "10.96.0.10:80", None),
            // Inbound: the pod's own ports are fine, the proxy's in-pod
            // listeners are not; the admin ports are the app's here.
            (Inbound, "10.244.1.5:8080", None),
            (Inbound, "10.244.1.5:15006", Some(ProxyPort)),
            (Inbound, "10.244.1.5:15001", Some(ProxyPort)),
            (Inbound, "10.244.1.5:15008", Some(ProxyPort)),
            (Inbound, "10.244.1.5:15000", None),
            (Inbound, "10.244.1.5:15020", None),
            (Inbound, "10.244.1.5:15021", None),
            (Inbound, "127.0.0.1:15006", Some(ProxyPort)),
        ];
        for (side, dst, want) in cases {
            let dst = a(dst);
            assert_eq!(self_call(*side, dst, &own), want.map(|f| f(dst)), "{side:?} {dst}");
        }
    }

    #[test]
    fn says_why() {
        let s = self_call(Side::Outbound, "127.0.0.1:15001".parse().unwrap(), &[]).unwrap();
        assert_eq!(s.to_string(), "self-call refused: 127.0.0.1:15001 is one of the node proxy's own ports on a local address");
    }

    #[test]
    fn in_the_loopback_tier_other_loopback_addresses_are_pods() {
        let own: Vec<IpAddr> = vec!["127.81.1.1".parse().unwrap()];
        let a = |s: &str| -> SocketAddr { s.parse().unwrap() };
        assert_eq!(self_call_in(Side::Outbound, a("127.81.9.9:80"), &own, false), None);
        assert_eq!(self_call_in(Side::Outbound, a("127.81.1.1:80"), &own, false), Some(SelfCall::OwnAddress(a("127.81.1.1:80"))));
        assert_eq!(self_call_in(Side::Outbound, a("127.81.1.1:15001"), &own, false), Some(SelfCall::ProxyPort(a("127.81.1.1:15001"))));
        assert_eq!(self_call_in(Side::Outbound, a("0.0.0.0:80"), &own, false), Some(SelfCall::Unspecified(a("0.0.0.0:80"))));
        assert_eq!(self_call_in(Side::Outbound, a("127.81.9.9:80"), &own, true), Some(SelfCall::Loopback(a("127.81.9.9:80"))));
    }
}
