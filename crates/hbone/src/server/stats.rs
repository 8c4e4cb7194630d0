//! Counters the server keeps per outcome; the node proxy exports them.

use std::sync::atomic::{AtomicU64, Ordering};

use http::StatusCode;

/// Live counters. Read them with [`ServerStats::snapshot`].
#[derive(Debug, Default)]
pub struct ServerStats {
    connections_accepted: AtomicU64,
    refused_no_workload: AtomicU64,
    refused_cert_unavailable: AtomicU64,
    refused_limit: AtomicU64,
    tls_failures: AtomicU64,
    h2_failures: AtomicU64,
    keepalive_timeouts: AtomicU64,
    protocol_errors: AtomicU64,
    drain_forced_closes: AtomicU64,
    streams: AtomicU64,
    status_200: AtomicU64,
    status_400: AtomicU64,
    status_401: AtomicU64,
    status_503: AtomicU64,
    status_other: AtomicU64,
    tunnels_failed: AtomicU64,
    bytes_from_peer: AtomicU64,
    bytes_to_peer: AtomicU64,
}

/// A point-in-time copy of [`ServerStats`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub connections_accepted: u64,
    /// TLS refused: no local workload owns the destination IP.
    pub refused_no_workload: u64,
    /// TLS refused: the destination workload's certificate is unavailable.
    pub refused_cert_unavailable: u64,
    /// Refused before the handshake by the handler's admission (a peer over
    /// its limits, or the proxy's budget spent).
    pub refused_limit: u64,
    /// Handshakes that failed (garbage, bad client certificate, timeouts...).
    pub tls_failures: u64,
    pub h2_failures: u64,
    pub keepalive_timeouts: u64,
    /// Established connections ended by an HTTP/2 protocol error (e.g. a
    /// header block far over the limit).
    pub protocol_errors: u64,
    pub drain_forced_closes: u64,
    pub streams: u64,
    pub status_200: u64,
    pub status_400: u64,
    pub status_401: u64,
    pub status_503: u64,
    pub status_other: u64,
    /// Tunnels answered 200 that later ended with an error.
    pub tunnels_failed: u64,
    pub bytes_from_peer: u64,
    pub bytes_to_peer: u64,
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl ServerStats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            connections_accepted: get(&self.connections_accepted),
            refused_no_workload: get(&self.refused_no_workload),
            refused_cert_unavailable: get(&self.refused_cert_unavailable),
            refused_limit: get(&self.refused_limit),
            tls_failures: get(&self.tls_failures),
            h2_failures: get(&self.h2_failures),
            keepalive_timeouts: get(&self.keepalive_timeouts),
            protocol_errors: get(&self.protocol_errors),
            drain_forced_closes: get(&self.drain_forced_closes),
            streams: get(&self.streams),
            status_200: get(&self.status_200),
            status_400: get(&self.status_400),
            status_401: get(&self.status_401),
            status_503: get(&self.status_503),
            status_other: get(&self.status_other),
            tunnels_failed: get(&self.tunnels_failed),
            bytes_from_peer: get(&self.bytes_from_peer),
            bytes_to_peer: get(&self.bytes_to_peer),
        }
    }

    pub(crate) fn connection_accepted(&self) {
        inc(&self.connections_accepted)
    }
    pub(crate) fn refused_no_workload(&self) {
        inc(&self.refused_no_workload)
    }
    pub(crate) fn refused_cert_unavailable(&self) {
        inc(&self.refused_cert_unavailable)
    }
    pub(crate) fn refused_limit(&self) {
        inc(&self.refused_limit)
    }
    pub(crate) fn tls_failure(&self) {
        inc(&self.tls_failures)
    }
    pub(crate) fn h2_failure(&self) {
        inc(&self.h2_failures)
    }
    pub(crate) fn keepalive_timeout(&self) {
        inc(&self.keepalive_timeouts)
    }
    pub(crate) fn protocol_error(&self) {
        inc(&self.protocol_errors)
    }
    pub(crate) fn drain_forced_close(&self) {
        inc(&self.drain_forced_closes)
    }
    pub(crate) fn stream(&self) {
        inc(&self.streams)
    }
    pub(crate) fn answered(&self, status: StatusCode) {
        inc(match status.as_u16() {
            200 => &self.status_200,
            400 => &self.status_400,
            401 => &self.status_401,
            503 => &self.status_503,
            _ => &self.status_other,
        })
    }
    pub(crate) fn tunnel_finished(&self, from_peer: u64, to_peer: u64, failed: bool) {
        self.bytes_from_peer.fetch_add(from_peer, Ordering::Relaxed);
        self.bytes_to_peer.fetch_add(to_peer, Ordering::Relaxed);
        if failed {
            inc(&self.tunnels_failed);
        }
    }
}
