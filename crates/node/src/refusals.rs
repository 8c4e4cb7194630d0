//! Inbound HBONE traffic that the HBONE server turned away on its own,
//! before the handler chose an upstream. The proxy hears of it only through
//! the server's callbacks; it is counted and logged here, once.

use crate::conn::{ConnInfo, ConnRecord};
use crate::inpod::LocalPod;
use crate::metrics::{Reporter, ResponseFlag};
use crate::proxy::Shared;
use slipstream_hbone::{HandshakeFailure, HandshakeFailureKind, StreamRecord};

/// A CONNECT the server refused before asking the handler (400 for a bad
/// request or an authority that is not the tunnel's, 503 for a proxy port):
/// one connection in the metrics and one access-log line, like the
/// refusals the handler makes itself. Streams the handler saw are its own
/// to record, so they are skipped here.
pub fn record_refused_stream(shared: &Shared, pod: &LocalPod, r: &StreamRecord) {
    if r.reached_handler {
        return;
    }
    // Refused streams always carry their error.
    let Err(e) = &r.result else { return };
    let snap = shared.snapshot.borrow().clone();
    let dst = snap.mesh.workload(&pod.uid);
    let info = ConnInfo {
        reporter: Reporter::Destination,
        src_addr: r.peer_addr,
        src: snap.mesh.workload_by_ip(r.peer_addr.ip()),
        src_identity: r.peer_identity.to_string(),
        // No parsable authority: the tunnel's own address is what is known.
        dst_addr: r.target.unwrap_or(r.tunnel_local),
        hbone_addr: Some(r.tunnel_local),
        dst_identity: dst.as_ref().map(|w| w.spiffe_id()).unwrap_or_default(),
        dst,
        service: None,
        mutual_tls: true,
    };
    ConnRecord::open(info, shared.telemetry.clone()).close(0, 0, Some((e.flag(), e.to_string())));
}

/// The response flag a connection refused at the handshake is counted with.
pub fn handshake_flag(kind: HandshakeFailureKind) -> ResponseFlag {
    match kind {
        HandshakeFailureKind::Http2 => ResponseFlag::ProtocolError,
        HandshakeFailureKind::PeerConnectionLimit | HandshakeFailureKind::PeerHandshakeLimit => ResponseFlag::SourceLimit,
        HandshakeFailureKind::Overload => ResponseFlag::Overload,
        _ => ResponseFlag::TlsFailure,
    }
}

/// A connection on :15008 that never carried a stream: not TLS, an
/// untrusted client certificate, a timeout... No workload can be named, so
/// it is counted in `slipstream_rejected_connections_total` by reason, and
/// logged once with the peer's address (a few lines per peer and second at
/// most: the rest are summarised, the counter has them all).
pub fn record_handshake_failure(shared: &Shared, f: &HandshakeFailure) {
    let flag = handshake_flag(f.kind);
    shared.telemetry.metrics.rejected_because(flag, f.kind.as_str());
    if !shared.telemetry.log_refusal(&f.peer_addr.ip().to_canonical().to_string()) {
        return;
    }
    tracing::warn!(target: crate::conn::REFUSAL_TARGET, peer = %f.peer_addr, local = %f.local_addr, reason = %f.kind, %flag, "inbound HBONE connection refused: {}", f.detail);
}
