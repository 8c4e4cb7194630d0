//! Copying bytes between a tunnel and a plain socket, both ways, with
//! half-close propagation and byte counts that survive failures.

use std::sync::atomic::{AtomicU64, Ordering};

use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::error::HboneError;
use crate::stream::{TunnelReader, TunnelStream, TunnelWriter, MAX_WRITE_CHUNK};

/// Reads up to this size go through a buffer on the stack that lives only
/// for one poll: a connection waiting for its next bytes holds no read
/// buffer at all, so 10k idle connections cost no buffer memory, and a small
/// read pays one copy of the bytes that arrived.
const STACK_READ: usize = 16 * 1024;

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
    // Small reads (interactive traffic, idle connections) go through the
    // stack. Once a read fills it, the transfer is bulk: reads go straight
    // into a heap buffer handed to h2 without a copy, doubling up to one
    // maximum-size frame while they fill it and halving when they do not;
    // back at the stack size the heap buffer is released.
    let mut size = STACK_READ;
    let mut buf = BytesMut::new();
    loop {
        let chunk = if size <= STACK_READ {
            std::future::poll_fn(|cx| read_on_stack(other.as_mut(), cx)).await?
        } else {
            buf.reserve(size);
            other.read_buf(&mut buf).await?;
            // `split().freeze()` hands the bytes to h2 without copying.
            buf.split().freeze()
        };
        let n = chunk.len();
        if n == 0 {
            return tunnel.finish();
        }
        tunnel.send(chunk).await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
        size = next_read_size(size, n);
        if size <= STACK_READ && buf.capacity() > 0 {
            buf = BytesMut::new();
        }
    }
}

/// One read into a stack buffer; the bytes that arrived are copied out.
/// An empty result is end of stream.
fn read_on_stack<R: AsyncRead>(r: std::pin::Pin<&mut R>, cx: &mut Context<'_>) -> Poll<std::io::Result<Bytes>> {
    let mut stack = [0u8; STACK_READ];
    let mut rb = ReadBuf::new(&mut stack);
    ready!(r.poll_read(cx, &mut rb))?;
    Poll::Ready(Ok(Bytes::copy_from_slice(rb.filled())))
}

/// The next read size after a read of `n` bytes into `size`.
fn next_read_size(size: usize, n: usize) -> usize {
    if n >= size {
        (size * 2).min(MAX_WRITE_CHUNK)
    } else if n < size / 2 {
        STACK_READ.max(size / 2)
    } else {
        size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_size_grows_on_full_reads_and_falls_back_to_the_stack() {
        assert_eq!(next_read_size(STACK_READ, 100), STACK_READ);
        assert_eq!(next_read_size(STACK_READ, STACK_READ), 2 * STACK_READ);
        let mut s = STACK_READ;
        for _ in 0..20 {
            s = next_read_size(s, s);
        }
        assert_eq!(s, MAX_WRITE_CHUNK);
        assert_eq!(next_read_size(MAX_WRITE_CHUNK, MAX_WRITE_CHUNK / 2 + 1), MAX_WRITE_CHUNK, "a well-filled read keeps the size");
        assert_eq!(next_read_size(4 * STACK_READ, 10), 2 * STACK_READ);
        assert_eq!(next_read_size(2 * STACK_READ, 10), STACK_READ);
    }

    #[tokio::test]
    async fn small_and_bulk_reads_arrive_whole_and_in_order() {
        use tokio::io::AsyncWriteExt;
        let (mut w, r) = tokio::io::duplex(64 * 1024);
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let send = data.clone();
        let writer = tokio::spawn(async move {
            w.write_all(&send[..10]).await.unwrap();
            w.write_all(&send[10..]).await.unwrap();
        });
        tokio::pin!(r);
        let mut got = Vec::new();
        loop {
            let c = std::future::poll_fn(|cx| read_on_stack(r.as_mut(), cx)).await.unwrap();
            if c.is_empty() {
                break;
            }
            assert!(c.len() <= STACK_READ);
            got.extend_from_slice(&c);
        }
        writer.await.unwrap();
        assert_eq!(got, data);
    }
}
