//! Relaying bytes between two plain TCP sockets (passthrough outbound,
//! plaintext inbound), with the connection's cancellation polled alongside
//! the copy. HBONE tunnels use the hbone crate's copy.

use crate::error::ProxyError;
use crate::sockets::reset;
use crate::telemetry::Metered;
use futures_util::future;
use std::task::Poll;
use tokio::net::TcpStream;

/// Each direction's buffer of a plain copy, taken from the budget.
const PLAIN_BUFFER: usize = 64 * 1024;
/// What a plain copy uses when the budget refuses more.
const SMALL_PLAIN_BUFFER: usize = 8 * 1024;

/// Copies between a metered app socket and a plain one until both ends
/// close, or the connection is cancelled; says how it ended.
pub async fn copy_plain(mut app: Metered<TcpStream>, mut other: TcpStream) {
    let cell = app.cancel_handle();
    // Two 64 KiB buffers from the pod's share of the buffer budget, else
    // two of 8 KiB (slower, never refused).
    let budget = app.budget().cloned();
    let granted = budget.as_ref().is_some_and(|b| slipstream_hbone::copy::BufferBudget::take(&**b, 2 * PLAIN_BUFFER));
    let size = if granted || budget.is_none() { PLAIN_BUFFER } else { SMALL_PLAIN_BUFFER };
    let copied = {
        let copy = tokio::io::copy_bidirectional_with_sizes(&mut app, &mut other, size, size);
        let cancelled = future::poll_fn(|cx| match &cell {
            Some(c) if c.poll_cancelled(cx).is_some() => Poll::Ready(()),
            _ => Poll::Pending,
        });
        tokio::select! {
            r = copy => Some(r),
            _ = cancelled => None,
        }
    };
    if let (true, Some(b)) = (granted, &budget) {
        slipstream_hbone::copy::BufferBudget::give(&**b, 2 * PLAIN_BUFFER);
    }
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
