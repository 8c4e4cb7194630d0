//! One inbound TCP connection: choose the certificate by destination IP,
//! TLS with client authentication, then HTTP/2 until the peer leaves, the
//! keepalive fails or a drain ends it.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::Request;
use slipstream_identity::tls::peer_identity;
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use tokio_rustls::TlsAcceptor;

use super::handler::ResolveError;
use super::inbound::{serve_stream, ConnContext};
use super::Shared;
use crate::drain::DrainWatch;
use crate::h2config::keepalive;

enum Event {
    Stream(Option<Result<(Request<RecvStream>, SendResponse<Bytes>), h2::Error>>),
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
    let _ = tcp.set_nodelay(true);
    let deadline = Instant::now() + shared.config.handshake_timeout;

    // The destination workload's own certificate; an IP with no local
    // workload gets a handshake that fails with an alert.
    let (tls_config, refused) = match timeout_at(deadline, shared.certs.resolve(local.ip())).await {
        Ok(Ok(cert)) => match shared.tls.config_for(&cert) {
            Ok(config) => (config, false),
            Err(e) => {
                tracing::warn!(%local, error = %e, "unusable workload certificate");
                stats.refused_cert_unavailable();
                (shared.tls.refusing_config(), true)
            }
        },
        Ok(Err(ResolveError::NoWorkload(_))) => {
            stats.refused_no_workload();
            (shared.tls.refusing_config(), true)
        }
        Ok(Err(e)) => {
            tracing::warn!(%local, error = %e, "no certificate for inbound connection");
            stats.refused_cert_unavailable();
            (shared.tls.refusing_config(), true)
        }
        Err(_) => {
            tracing::warn!(%local, "certificate lookup timed out");
            stats.refused_cert_unavailable();
            (shared.tls.refusing_config(), true)
        }
    };

    let tls = match timeout_at(deadline, TlsAcceptor::from(tls_config).accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            if !refused {
                stats.tls_failure();
            }
            tracing::debug!(%peer_addr, %local, error = %e, "inbound TLS handshake failed");
            return;
        }
        Err(_) => {
            if !refused {
                stats.tls_failure();
            }
            tracing::debug!(%peer_addr, %local, "inbound TLS handshake timed out");
            return;
        }
    };
    let identity = match peer_identity(tls.get_ref().1) {
        Ok(id) => id,
        Err(e) => {
            // Unreachable with our verifier (it requires a SPIFFE SAN), but
            // never serve a tunnel without an identity.
            stats.tls_failure();
            tracing::warn!(%peer_addr, error = %e, "no peer identity after handshake");
            return;
        }
    };

    let builder = shared.config.h2.server_builder(shared.config.max_concurrent_streams);
    let mut conn = match timeout_at(deadline, builder.handshake::<_, Bytes>(tls)).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            stats.h2_failure();
            tracing::debug!(%peer_addr, error = %e, "inbound HTTP/2 handshake failed");
            return;
        }
        Err(_) => {
            stats.h2_failure();
            return;
        }
    };

    let ctx = Arc::new(ConnContext {
        peer_identity: identity,
        peer_addr,
        tunnel_local: local,
        handler: shared.handler.clone(),
        stats: shared.stats.clone(),
        proxy_ports: shared.config.proxy_ports.clone().into(),
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
                let ctx = ctx.clone();
                // Each stream holds the drain open until its record is out.
                let drain = drain.clone();
                tokio::spawn(async move {
                    serve_stream(ctx, request, respond).await;
                    drop(drain);
                });
            }
            Event::Stream(Some(Err(e))) => {
                tracing::debug!(%peer_addr, error = %e, "inbound HTTP/2 connection failed");
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
