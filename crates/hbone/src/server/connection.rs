//! One inbound TCP connection: choose the certificate by destination IP,
//! TLS with client authentication, then HTTP/2 until the peer leaves, the
//! keepalive fails or a drain ends it.

use futures_util::FutureExt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use h2::server::SendResponse;
use h2::RecvStream;
use http::Request;
use slipstream_core::spiffe::SpiffeId;
use slipstream_identity::tls::peer_identity;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use tokio_rustls::TlsAcceptor;

use super::handler::ResolveError;
use super::handshake::{classify_tls, FirstBytes, HandshakeFailure, HandshakeFailureKind, PEEK_LEN};
use super::inbound::{serve_stream, ConnContext};
use super::Shared;
use crate::chunk::Chunk;
use crate::coalesce::Coalesce;
use crate::drain::DrainWatch;
use crate::h2config::keepalive;

type Accepted = Option<Result<(Request<RecvStream>, SendResponse<Chunk>), h2::Error>>;

// One short-lived value per loop turn; boxing the big variant would cost an
// allocation per stream for nothing.
#[allow(clippy::large_enum_variant)]
enum Event {
    Stream(Accepted),
    KeepaliveTimeout,
    Drain(Instant),
    DrainDeadline,
}

pub(crate) async fn serve_connection(tcp: TcpStream, peer_addr: SocketAddr, shared: Arc<Shared>, drain: DrainWatch) {
    let stats = &shared.stats;
    stats.connection_accepted();
    let Ok(local) = tcp.local_addr() else {
        return;
    };
    // Before anything is read: a peer over its limits costs no handshake.
    let admission = match shared.handler.admit(peer_addr, local) {
        Ok(a) => a,
        Err(refused) => {
            stats.refused_limit();
            // Closed with a reset (SO_LINGER 0): the peer fails at once.
            let _ = tcp.set_zero_linger();
            drop(tcp);
            return shared.handler.on_handshake_failure(&HandshakeFailure {
                peer_addr,
                local_addr: local,
                kind: refused.kind,
                detail: refused.detail,
            });
        }
    };
    let _connection_permit = admission.connection;
    let handshake_permit = admission.handshake;
    let context = admission.context;
    let window = WindowLease::take(admission.window, &shared.config.h2);
    let _ = tcp.set_nodelay(true);
    let deadline = Instant::now() + shared.config.handshake_timeout;
    let Some((mut conn, identity)) = handshake(tcp, peer_addr, local, &shared, window.size, deadline).await else {
        return;
    };

    drop(handshake_permit);
    let ctx = Arc::new(ConnContext {
        peer_identity: identity,
        peer_addr,
        tunnel_local: local,
        handler: shared.handler.clone(),
        stats: shared.stats.clone(),
        proxy_ports: shared.config.proxy_ports.clone().into(),
        context,
    });
    let ping_pong = conn.ping_pong();
    let (interval, ka_timeout) = (shared.config.h2.keepalive_interval, shared.config.h2.keepalive_timeout);
    let keepalive = async move {
        match ping_pong {
            Some(pp) => keepalive(pp, interval, ka_timeout).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(keepalive);
    let mut drain_deadline: Option<Instant> = None;

    loop {
        // Poll into a value first: `graceful_shutdown` needs `conn` again.
        let event = tokio::select! {
            next = conn.accept() => Event::Stream(next),
            () = &mut keepalive => Event::KeepaliveTimeout,
            d = drain.signaled(), if drain_deadline.is_none() => Event::Drain(d),
            () = tokio::time::sleep_until(drain_deadline.unwrap_or_else(Instant::now)), if drain_deadline.is_some() => Event::DrainDeadline,
        };
        match event {
            Event::Stream(Some(Ok((request, respond)))) => {
                // Each stream holds the drain open until its record is out.
                // A combinator, not an async block: awaiting the stream in
                // one would keep it in the task twice (see serve_stream).
                let drain = drain.clone();
                let task = serve_stream(ctx.clone(), request, respond).map(move |()| drop(drain));
                tokio::spawn(task);
            }
            Event::Stream(Some(Err(e))) => {
                if e.is_io() {
                    // The peer went away (reset, closed mid-frame).
                    tracing::debug!(%peer_addr, error = %e, "inbound HTTP/2 connection failed");
                } else {
                    // A protocol error ends every stream of the connection:
                    // worth a line and a counter.
                    stats.protocol_error();
                    tracing::warn!(%peer_addr, %local, error = %e, "HBONE connection closed on an HTTP/2 protocol error");
                }
                break;
            }
            // Closed by the peer, or drained with no stream left.
            Event::Stream(None) => break,
            Event::KeepaliveTimeout => {
                stats.keepalive_timeout();
                tracing::warn!(%peer_addr, "HBONE peer stopped answering PINGs; dropping the connection");
                break;
            }
            Event::Drain(deadline) => {
                // GOAWAY: no new streams; open ones may finish until the deadline.
                conn.graceful_shutdown();
                drain_deadline = Some(deadline);
            }
            Event::DrainDeadline => {
                stats.drain_forced_close();
                break;
            }
        }
    }
}

/// An HTTP/2 connection over TLS, as the handshakes leave it.
type Handshaken = (h2::server::Connection<Coalesce<tokio_rustls::server::TlsStream<TcpStream>>, Chunk>, SpiffeId);

/// The handshakes of an admitted connection, all by `deadline`: its first
/// bytes peeked, the destination workload's certificate, TLS with client
/// authentication, the peer's identity, HTTP/2. Once per connection, off
/// the streams' path. Every way it fails is reported once, here, with a
/// reason from a fixed set, and gives None.
async fn handshake(
    tcp: TcpStream,
    peer_addr: SocketAddr,
    local: SocketAddr,
    shared: &Shared,
    window: u32,
    deadline: Instant,
) -> Option<Handshaken> {
    let stats = &shared.stats;
    // Every way this connection can end before its first stream is reported
    // once, here, with a reason from a fixed set.
    let fail = |kind: HandshakeFailureKind, detail: String| -> Option<Handshaken> {
        tracing::debug!(%peer_addr, %local, reason = %kind, "inbound handshake failed: {detail}");
        shared.handler.on_handshake_failure(&HandshakeFailure { peer_addr, local_addr: local, kind, detail });
        None
    };

    // The first bytes tell a TLS client from plaintext or garbage; peeking
    // leaves them for the handshake.
    let mut buf = [0u8; PEEK_LEN];
    let first = match timeout_at(deadline, tcp.peek(&mut buf)).await {
        Ok(Ok(0)) => {
            stats.tls_failure();
            return fail(HandshakeFailureKind::Closed, "the peer closed the connection without sending anything".to_owned());
        }
        Ok(Ok(n)) => FirstBytes::new(buf, n),
        Ok(Err(e)) => {
            stats.tls_failure();
            return fail(HandshakeFailureKind::Closed, format!("reading the handshake: {e}"));
        }
        Err(_) => {
            stats.tls_failure();
            return fail(HandshakeFailureKind::Timeout, format!("the peer sent nothing for {:?}", shared.config.handshake_timeout));
        }
    };

    // The destination workload's own certificate; an IP with no local
    // workload gets a handshake that fails with an alert.
    let (tls_config, refused) = match timeout_at(deadline, shared.certs.resolve(local.ip())).await {
        Ok(Ok(cert)) => match shared.tls.config_for(&cert) {
            Ok(config) => (config, None),
            Err(e) => {
                stats.refused_cert_unavailable();
                let why = format!("the certificate of the workload at {local} is unusable: {e}");
                (shared.tls.refusing_config(), Some((HandshakeFailureKind::CertUnavailable, why)))
            }
        },
        Ok(Err(e @ ResolveError::NoWorkload(_))) => {
            stats.refused_no_workload();
            (shared.tls.refusing_config(), Some((HandshakeFailureKind::NoWorkload, e.to_string())))
        }
        Ok(Err(e)) => {
            stats.refused_cert_unavailable();
            (shared.tls.refusing_config(), Some((HandshakeFailureKind::CertUnavailable, e.to_string())))
        }
        Err(_) => {
            stats.refused_cert_unavailable();
            let why = format!("certificate lookup for {local} timed out");
            (shared.tls.refusing_config(), Some((HandshakeFailureKind::CertUnavailable, why)))
        }
    };

    let accept = TlsAcceptor::from(tls_config).accept(tcp).into_fallible();
    let tls = match timeout_at(deadline, accept).await {
        Ok(Ok(tls)) => match refused {
            None => tls,
            // The refusing configuration never completes a handshake.
            Some((kind, detail)) => return fail(kind, detail),
        },
        Ok(Err((e, tcp))) => {
            let _ = match refused {
                Some((kind, detail)) => fail(kind, detail),
                None => {
                    stats.tls_failure();
                    let (kind, detail) = classify_tls(&e, &first);
                    fail(kind, detail)
                }
            };
            close_after_alert(tcp).await;
            return None;
        }
        Err(_) => {
            return match refused {
                Some((kind, detail)) => fail(kind, detail),
                None => {
                    stats.tls_failure();
                    match first.not_tls() {
                        Some(detail) => fail(HandshakeFailureKind::NotTls, detail),
                        None => fail(HandshakeFailureKind::Timeout, "the TLS handshake did not finish in time".to_owned()),
                    }
                }
            };
        }
    };
    let identity = match peer_identity(tls.get_ref().1) {
        Ok(id) => id,
        Err(e) => {
            // Unreachable with our verifier (it requires a SPIFFE SAN), but
            // never serve a tunnel without an identity.
            stats.tls_failure();
            return fail(HandshakeFailureKind::Tls, format!("no peer identity after the handshake: {e}"));
        }
    };

    let builder = shared.config.h2.server_builder(shared.config.max_concurrent_streams, window);
    let conn = match timeout_at(deadline, builder.handshake::<_, Chunk>(Coalesce::new(tls))).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            stats.h2_failure();
            return fail(HandshakeFailureKind::Http2, format!("HTTP/2 handshake: {e}"));
        }
        Err(_) => {
            stats.h2_failure();
            return fail(HandshakeFailureKind::Timeout, "the HTTP/2 preface did not arrive in time".to_owned());
        }
    };
    Some((conn, identity))
}

/// How long a connection whose handshake failed may keep sending before it
/// is closed, and how much of it is read.
const ALERT_LINGER: Duration = Duration::from_secs(1);
const ALERT_LINGER_BYTES: usize = 64 * 1024;

/// Closes a connection whose TLS handshake failed without resetting it. A
/// TLS 1.3 client considers the handshake done before the server has
/// checked its certificate and sends its HTTP/2 preface at once; closing
/// with those bytes unread makes the kernel answer with a reset, and the
/// client's next write then fails before it reads our alert, so it cannot
/// tell why it was refused. Ending our side and reading what still comes,
/// briefly, lets it read the alert.
async fn close_after_alert(mut tcp: TcpStream) {
    let _ = tcp.shutdown().await;
    let drain = async {
        let mut buf = [0u8; 4096];
        let mut total = 0;
        while total < ALERT_LINGER_BYTES {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(ALERT_LINGER, drain).await;
}

/// A connection's receive window, as its memory budget gives it: the full
/// window taken for the connection's life, or the smallest one without.
struct WindowLease {
    size: u32,
    taken: Option<Arc<dyn crate::copy::BufferBudget>>,
}

impl WindowLease {
    fn take(budget: Option<Arc<dyn crate::copy::BufferBudget>>, h2: &crate::h2config::H2Config) -> WindowLease {
        match budget {
            None => WindowLease { size: h2.connection_window, taken: None },
            Some(b) if b.take(h2.connection_window as usize) => WindowLease { size: h2.connection_window, taken: Some(b) },
            Some(_) => WindowLease { size: h2.min_connection_window.min(h2.connection_window), taken: None },
        }
    }
}

impl Drop for WindowLease {
    fn drop(&mut self) {
        if let Some(b) = self.taken.take() {
            b.give(self.size as usize);
        }
    }
}
