//! Relaying bytes between two plain TCP sockets (passthrough outbound,
//! plaintext inbound), with the connection's cancellation polled alongside
//! the copy. HBONE tunnels use the hbone crate's copy.

use crate::error::ProxyError;
use crate::sockets::reset;
use crate::telemetry::Metered;
use futures_util::future;
use std::task::Poll;
use tokio::net::TcpStream;

/// Copies between a metered app socket and a plain one until both ends
/// close, or the connection is cancelled; says how it ended.
pub async fn copy_plain(mut app: Metered<TcpStream>, mut other: TcpStream) {
    let cell = app.cancel_handle();
    let copied = {
        let copy = tokio::io::copy_bidirectional_with_sizes(&mut app, &mut other, 64 * 1024, 64 * 1024);
        let cancelled = future::poll_fn(|cx| match &cell {
            Some(c) if c.poll_cancelled(cx).is_some() => Poll::Ready(()),
            _ => Poll::Pending,
        });
        tokio::select! {
            r = copy => Some(r),
            _ = cancelled => None,
        }
    };
    match copied {
        Some(Ok(_)) => app.finished_with(Ok(())),
        Some(Err(e)) => app.finished_with(Err(ProxyError::terminated(e))),
        // The record closes with the cancellation's reason; both ends see
        // a reset, not an end of stream they could take for completion.
        None => {
            reset(app.get_ref());
            reset(&other);
        }
    }
}
