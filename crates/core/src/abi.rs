//! The numbers that several components must agree on without talking to each
//! other: the capture rules installed in a pod's namespace (the testbed's
//! nftables rules today, eBPF programs later), the node proxy that owns the
//! sockets those rules recognise, and whatever probes the proxy from outside.
//! Change one here and every side changes with it; a value written out by
//! hand anywhere else is a bug waiting for the next change.
//!
//! The in-pod listeners (15001, 15006, 15008) are reached inside a pod's
//! network namespace. The admin ports listen in the node's namespace, never
//! in a pod's: a pod's `<own IP>:15020` reaches the pod's app, not the
//! proxy, so no data-path rule lists them.

use std::net::{IpAddr, SocketAddr};

/// Socket mark on the node proxy's own outbound sockets (and the debug
/// tools' bypass). Relied on by capture, which returns early for it so the
/// proxy's connections are never redirected back into the proxy.
pub const PROXY_MARK: u32 = 0x539;

/// Socket mark on the node proxy's transparent inbound sockets (connecting
/// to the app with the original source address). Relied on by capture,
/// which saves it in conntrack so the app's replies carry it and are routed
/// back to the proxy through [`ROUTE_TABLE`] instead of out of the pod.
pub const INPOD_MARK: u32 = 0x111;

/// The bits of the socket mark that [`PROXY_MARK`] and [`INPOD_MARK`] use.
/// Capture compares `mark & MARK_MASK`, so other users of the mark (the
/// CNI, eBPF programs) keep the bits above.
pub const MARK_MASK: u32 = 0xfff;

/// The routing table, inside the pod's namespace, of the inbound reply
/// route: packets marked [`INPOD_MARK`] are delivered locally (to the
/// proxy's transparent socket). Relied on by capture, which installs both
/// the rule (`fwmark INPOD_MARK/MARK_MASK lookup ROUTE_TABLE`) and the route.
pub const ROUTE_TABLE: u32 = 100;

/// The nftables table (family `inet`) in which a node proxy enforces
/// network policy for its node's pods outside the mesh (`--netpol-kernel`);
/// the node agent removes it on uninstall.
pub const NETPOL_TABLE: &str = "slipstream_netpol";

/// The proxy's outbound listener in each pod (`127.0.0.1:15001`), where
/// capture redirects the pod's outbound TCP. Relied on by capture and by
/// the proxy's self-call check (CONNECT may never target it).
pub const OUTBOUND_PORT: u16 = 15001;

/// The proxy's plaintext inbound listener in each pod, where capture
/// redirects inbound TCP that is not HBONE. Relied on by capture and by the
/// proxy's self-call check.
pub const INBOUND_PLAINTEXT_PORT: u16 = 15006;

/// The proxy's HBONE listener (`<pod IP>:15008`): the one port peers dial
/// and the one inbound port capture leaves alone. Relied on by capture, by
/// every HBONE client (the address of a peer's tunnel) and by the
/// self-call check.
pub const HBONE_PORT: u16 = 15008;

/// The proxy's own in-pod ports, which a CONNECT may never target (it would
/// loop back into the proxy). Relied on by the HBONE server and the node
/// proxy's self-call check.
pub const PROXY_PORTS: [u16; 3] = [OUTBOUND_PORT, INBOUND_PLAINTEXT_PORT, HBONE_PORT];

/// The node proxy's admin server (`/config_dump`), in the node's namespace.
/// Relied on by operators and the testbed's tooling.
pub const ADMIN_PORT: u16 = 15000;

/// The node proxy's Prometheus metrics, in the node's namespace. Relied on
/// by scrapers and the testbed's tests.
pub const STATS_PORT: u16 = 15020;

/// The node proxy's readiness endpoint (`/healthz/ready`), in the node's
/// namespace. Relied on by the testbed's supervisor, which probes it.
pub const READINESS_PORT: u16 = 15021;

/// The socket address of a workload's HBONE listener: what an HBONE client
/// dials to reach the proxy in front of `ip`.
pub fn hbone_addr(ip: IpAddr) -> SocketAddr {
    SocketAddr::new(ip, HBONE_PORT)
}

/// The control plane: delta xDS and the certificate service, over TLS
/// (istiod's port).
pub const CONTROL_PLANE_PORT: u16 = 15012;

/// The control plane's monitoring port: readiness (`/ready`), what each
/// proxy was sent and acknowledged (`/debug/syncz`), metrics. Loopback
/// only (istiod's port).
pub const CONTROL_MONITOR_PORT: u16 = 15014;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_fit_the_mask_and_differ() {
        assert_eq!(PROXY_MARK & MARK_MASK, PROXY_MARK);
        assert_eq!(INPOD_MARK & MARK_MASK, INPOD_MARK);
        assert_ne!(PROXY_MARK, INPOD_MARK);
    }

    #[test]
    fn ports_are_distinct() {
        let mut all = vec![ADMIN_PORT, STATS_PORT, READINESS_PORT];
        all.extend(PROXY_PORTS);
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
        assert_eq!(hbone_addr("10.0.0.1".parse().unwrap()).to_string(), "10.0.0.1:15008");
    }
}
