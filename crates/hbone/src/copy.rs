//! Copying bytes between a tunnel and a plain socket, both ways, with
//! half-close propagation and byte counts that survive failures.

use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use crate::chunk::{Chunk, InFlight, Lease};
use crate::error::HboneError;
use crate::stream::{TunnelReader, TunnelStream, TunnelWriter, MAX_WRITE_CHUNK};

/// Reads up to this size go through a buffer on the stack that lives only
/// for one poll: a connection waiting for its next bytes holds no read
/// buffer at all, so 10k idle connections cost no buffer memory, and a small
/// read pays one copy of the bytes that arrived.
const STACK_READ: usize = 16 * 1024;

pub use crate::chunk::BufferBudget;

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
    bidirectional_within(tunnel, other, None)
}

/// As [`bidirectional`], what it reads from the socket and has not yet
/// seen written out by h2 taken from `budget`: its bulk buffer (up to
/// 1 MiB) and every chunk in h2's send queue. While the budget refuses,
/// the copy reads through the stack, one small chunk in flight at a time:
/// slower, and never stopped.
pub fn bidirectional_within<S>(tunnel: TunnelStream, other: S, budget: Option<std::sync::Arc<dyn BufferBudget>>) -> Bidirectional<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (reader, writer) = tunnel.into_split();
    Bidirectional {
        in_flight: budget.map(|b| Arc::new(InFlight::new(b))),
        granted: 0,
        reader,
        writer,
        other,
        down_pending: Bytes::new(),
        down: Down::Copying,
        up_pending: Chunk::default(),
        up_buf: BytesMut::new(),
        up_size: STACK_READ,
        up_done: false,
        stats: CopyStats::default(),
    }
}

/// The future of [`bidirectional`].
pub struct Bidirectional<S> {
    /// Where the memory of what is read comes from, and this stream's
    /// chunks in h2's send queue (with a budget only).
    in_flight: Option<Arc<InFlight>>,
    /// Budget taken for the next read and not yet handed to a chunk: at
    /// most one frame (1 MiB), 32 bits beside `up_done`.
    granted: u32,
    reader: TunnelReader,
    writer: TunnelWriter,
    other: S,
    /// Tunnel to socket: the part of the last chunk not yet written.
    down_pending: Bytes,
    down: Down,
    /// Socket to tunnel: bytes read and not yet handed to h2.
    up_pending: Chunk,
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

impl<S> Drop for Bidirectional<S> {
    fn drop(&mut self) {
        if let (Some(f), n) = (&self.in_flight, self.granted) {
            if n > 0 {
                f.budget.give(n as usize);
            }
        }
    }
}

impl<S> Bidirectional<S> {
    /// Room for the next read, as the budget allows: the bulk size
    /// (`up_size`) if the budget gives it, else the stack's size, taken
    /// from the budget while this stream has chunks in flight, or without
    /// it once they are all written out (waiting for that if need be).
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(in_flight) = &self.in_flight else { return Poll::Ready(()) };
        let budget = &in_flight.budget;
        let held = self.granted as usize;
        if self.up_size > STACK_READ {
            if held >= self.up_size || budget.take(self.up_size - held) {
                self.granted = self.granted.max(self.up_size as u32);
                return Poll::Ready(());
            }
            self.up_size = STACK_READ;
        }
        if held >= STACK_READ || in_flight.is_drained() {
            return Poll::Ready(());
        }
        if budget.take(STACK_READ - held) {
            self.granted = STACK_READ as u32;
            return Poll::Ready(());
        }
        in_flight.poll_drained(cx)
    }

    /// `bytes` just read, in an allocation of `alloc` bytes, as a chunk
    /// that holds its share of the budget until h2 drops it; what was
    /// taken beyond the allocation is given back.
    fn lease(&mut self, bytes: Bytes, alloc: usize) -> Chunk {
        let Some(in_flight) = &self.in_flight else { return Chunk::from(bytes) };
        let held = (self.granted as usize).min(alloc);
        let rest = self.granted as usize - held;
        self.granted = 0;
        if rest > 0 {
            in_flight.budget.give(rest);
        }
        Chunk::leased(bytes, Lease::new(in_flight, held))
    }

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
    /// intermediate buffer, and their window goes back to the peer as
    /// they are written, so what we hold of a stream, in h2 and here, is
    /// within its window. Ready once the socket is shut down for writing.
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
                    // Window back to the peer only for bytes written out.
                    self.reader.release(n);
                }
                Down::Copying => match ready!(self.reader.poll_chunk_held(cx))? {
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
                let part = if n < self.up_pending.len() { self.up_pending.split_to(n) } else { std::mem::take(&mut self.up_pending) };
                self.writer.send_now(part)?;
                self.stats.to_tunnel += n as u64;
                continue;
            }
            ready!(self.poll_room(cx));
            let (bytes, alloc) = if self.up_size <= STACK_READ {
                let bytes = ready!(read_on_stack(Pin::new(&mut self.other), cx))?;
                let n = bytes.len();
                (bytes, n)
            } else {
                if self.up_buf.capacity() == 0 {
                    self.up_buf = BytesMut::with_capacity(self.up_size);
                }
                let alloc = self.up_buf.capacity();
                let read = self.other.read_buf(&mut self.up_buf);
                tokio::pin!(read);
                ready!(read.poll(cx))?;
                // The whole allocation goes with the chunk, to h2 without
                // a copy; the next bulk read allocates its own.
                (std::mem::take(&mut self.up_buf).freeze(), alloc)
            };
            if bytes.is_empty() {
                drop(self.lease(bytes, 0));
                self.writer.finish()?;
                self.up_done = true;
                continue;
            }
            self.up_size = next_read_size(self.up_size, bytes.len());
            self.up_pending = self.lease(bytes, alloc);
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
        assert!(size <= 344, "{size} bytes");
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
