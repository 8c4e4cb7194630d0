//! Copying bytes between a tunnel and a plain socket, both ways, with
//! half-close propagation and byte counts that survive failures.

use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

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
///
/// A hand-written future rather than an `async fn`: it lives as long as the
/// connection, so its size is per-connection memory, and a plain struct
/// holds each piece of state once (about a third of the async version, which
/// also needed a lock to split the socket).
pub fn bidirectional<S>(tunnel: TunnelStream, other: S) -> Bidirectional<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (reader, writer) = tunnel.into_split();
    Bidirectional {
        reader,
        writer,
        other,
        down_pending: Bytes::new(),
        down: Down::Copying,
        up_pending: Bytes::new(),
        up_buf: BytesMut::new(),
        up_size: STACK_READ,
        up_done: false,
        stats: CopyStats::default(),
    }
}

/// The future of [`bidirectional`].
pub struct Bidirectional<S> {
    reader: TunnelReader,
    writer: TunnelWriter,
    other: S,
    /// Tunnel to socket: the part of the last chunk not yet written.
    down_pending: Bytes,
    down: Down,
    /// Socket to tunnel: bytes read and not yet handed to h2.
    up_pending: Bytes,
    /// Bulk mode's read buffer (empty while reads go through the stack).
    up_buf: BytesMut,
    up_size: usize,
    up_done: bool,
    stats: CopyStats,
}

enum Down {
    Copying,
    /// End of stream from the tunnel: shutting the socket down for writing.
    Closing,
    Done,
}

impl<S> Bidirectional<S> {
    /// The bytes moved so far.
    pub fn stats(&self) -> CopyStats {
        self.stats
    }

    /// The non-tunnel side.
    pub fn other_mut(&mut self) -> &mut S {
        &mut self.other
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Future for Bidirectional<S> {
    type Output = (CopyStats, Result<(), HboneError>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let down = this.poll_down(cx);
        if let Poll::Ready(Err(e)) = down {
            return Poll::Ready((this.stats, Err(HboneError::io(e))));
        }
        let up = this.poll_up(cx);
        if let Poll::Ready(Err(e)) = up {
            return Poll::Ready((this.stats, Err(HboneError::io(e))));
        }
        if down.is_ready() && up.is_ready() {
            return Poll::Ready((this.stats, Ok(())));
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Bidirectional<S> {
    /// Tunnel to socket. Chunks are written as h2 received them: no
    /// intermediate buffer. Ready once the socket is shut down for writing.
    fn poll_down(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        loop {
            match self.down {
                Down::Done => return Poll::Ready(Ok(())),
                Down::Closing => {
                    ready!(Pin::new(&mut self.other).poll_shutdown(cx))?;
                    self.down = Down::Done;
                }
                Down::Copying if !self.down_pending.is_empty() => {
                    let n = ready!(Pin::new(&mut self.other).poll_write(cx, &self.down_pending))?;
                    if n == 0 {
                        return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                    }
                    self.down_pending.advance(n);
                    self.stats.from_tunnel += n as u64;
                }
                Down::Copying => match ready!(self.reader.poll_chunk(cx))? {
                    Some(chunk) => self.down_pending = chunk,
                    None => self.down = Down::Closing,
                },
            }
        }
    }

    /// Socket to tunnel. Small reads (interactive traffic, idle connections)
    /// go through the stack. Once a read fills it, the transfer is bulk:
    /// reads go straight into a heap buffer handed to h2 without a copy,
    /// doubling up to one maximum-size frame while they fill it and halving
    /// when they do not; back at the stack size the heap buffer is released.
    /// Ready once END_STREAM is sent.
    fn poll_up(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        loop {
            if self.up_done {
                return Poll::Ready(Ok(()));
            }
            if !self.up_pending.is_empty() {
                let n = ready!(self.writer.poll_capacity(cx, self.up_pending.len()))?;
                let part = self.up_pending.split_to(n);
                self.writer.send_now(part)?;
                self.stats.to_tunnel += n as u64;
                continue;
            }
            let chunk = if self.up_size <= STACK_READ {
                ready!(read_on_stack(Pin::new(&mut self.other), cx))?
            } else {
                self.up_buf.reserve(self.up_size);
                let read = self.other.read_buf(&mut self.up_buf);
                tokio::pin!(read);
                ready!(read.poll(cx))?;
                // `split().freeze()` hands the bytes to h2 without copying.
                self.up_buf.split().freeze()
            };
            if chunk.is_empty() {
                self.writer.finish()?;
                self.up_done = true;
                continue;
            }
            self.up_size = next_read_size(self.up_size, chunk.len());
            if self.up_size <= STACK_READ && self.up_buf.capacity() > 0 {
                self.up_buf = BytesMut::new();
            }
            self.up_pending = chunk;
        }
    }
}

/// One read into a stack buffer; the bytes that arrived are copied out.
/// An empty result is end of stream.
fn read_on_stack<R: AsyncRead>(r: Pin<&mut R>, cx: &mut Context<'_>) -> Poll<std::io::Result<Bytes>> {
    // Uninitialised: zeroing 16 KiB for every read was 2% of the proxy's
    // CPU under many small requests; the socket writes what it reads.
    let mut stack = [MaybeUninit::<u8>::uninit(); STACK_READ];
    let mut rb = ReadBuf::uninit(&mut stack);
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

    #[test]
    fn the_copy_state_of_a_connection_stays_small() {
        // Per-connection memory: 10k connections hold 10k of these.
        let size = std::mem::size_of::<Bidirectional<tokio::net::TcpStream>>();
        println!("Bidirectional<TcpStream>: {size} bytes");
        assert!(size <= 320, "{size} bytes");
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
