//! Copying bytes between a tunnel and a plain socket, both ways, with
//! half-close propagation and byte counts that survive failures.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::HboneError;
use crate::stream::{TunnelReader, TunnelStream, TunnelWriter, MAX_WRITE_CHUNK};

/// Smallest read buffer: idle and interactive connections stay cheap. Each
/// waiting connection holds one buffer of this size, so it decides the
/// proxy's memory with many open connections (10k x 2 KiB = 20 MiB); bulk
/// transfers double it on every full read and reach the 1 MiB frame size in
/// nine reads.
const MIN_READ_BUF: usize = 2 * 1024;

/// Bytes moved by [`bidirectional`], also when it failed half way.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CopyStats {
    /// Read from the tunnel, written to the other side.
    pub from_tunnel: u64,
    /// Read from the other side, sent into the tunnel.
    pub to_tunnel: u64,
}

/// Copies until both directions reached end of stream. Each EOF is passed
/// on as a half-close (END_STREAM into the tunnel, `shutdown` on the other
/// side). The first error in either direction stops both.
pub async fn bidirectional<S>(tunnel: TunnelStream, other: S) -> (CopyStats, Result<(), HboneError>)
where
    S: AsyncRead + AsyncWrite + Send,
{
    let (tunnel_rx, tunnel_tx) = tunnel.into_split();
    let (other_rx, other_tx) = tokio::io::split(other);
    let from_tunnel = AtomicU64::new(0);
    let to_tunnel = AtomicU64::new(0);

    let down = tunnel_to_socket(tunnel_rx, other_tx, &from_tunnel);
    let up = socket_to_tunnel(other_rx, tunnel_tx, &to_tunnel);
    tokio::pin!(down, up);
    let (mut down_done, mut up_done) = (false, false);
    let result = loop {
        if down_done && up_done {
            break Ok(());
        }
        tokio::select! {
            r = &mut down, if !down_done => match r {
                Ok(()) => down_done = true,
                Err(e) => break Err(e),
            },
            r = &mut up, if !up_done => match r {
                Ok(()) => up_done = true,
                Err(e) => break Err(e),
            },
        }
    };
    let stats = CopyStats {
        from_tunnel: from_tunnel.load(Ordering::Relaxed),
        to_tunnel: to_tunnel.load(Ordering::Relaxed),
    };
    (stats, result.map_err(HboneError::io))
}

async fn tunnel_to_socket<W: AsyncWrite>(
    mut tunnel: TunnelReader,
    other: W,
    count: &AtomicU64,
) -> std::io::Result<()> {
    tokio::pin!(other);
    // Chunks are written as h2 received them: no intermediate buffer.
    while let Some(chunk) = tunnel.chunk().await? {
        other.write_all(&chunk).await?;
        count.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
    other.shutdown().await
}

async fn socket_to_tunnel<R: AsyncRead>(
    other: R,
    mut tunnel: TunnelWriter,
    count: &AtomicU64,
) -> std::io::Result<()> {
    tokio::pin!(other);
    // The read size adapts: it doubles while reads fill the buffer (bulk
    // transfer, up to one maximum-size frame) and falls back when they do not,
    // so a thousand idle tunnels do not each hold a megabyte.
    let mut size = MIN_READ_BUF;
    let mut buf = BytesMut::new();
    loop {
        buf.reserve(size);
        let n = other.read_buf(&mut buf).await?;
        if n == 0 {
            return tunnel.finish();
        }
        // `split().freeze()` hands the bytes to h2 without copying.
        tunnel.send(buf.split().freeze()).await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
        size = if n >= size {
            (size * 2).min(MAX_WRITE_CHUNK)
        } else {
            MIN_READ_BUF.max(size / 2)
        };
    }
}
