//! One tunnelled TCP connection: an HTTP/2 CONNECT stream seen as a byte
//! stream.
//!
//! Flow control is what keeps memory bounded: the reader hands window back
//! to the peer only as bytes are consumed, and the writer only hands h2 as
//! many bytes as the peer's window allows, so a peer that stops reading
//! makes our writer wait instead of making us buffer.

use std::any::Any;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use h2::{Reason, RecvStream, SendStream};

use crate::chunk::Chunk;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest chunk handed to h2 per write: one maximum-size frame.
pub(crate) const MAX_WRITE_CHUNK: usize = 1024 * 1024;

/// Keeps something alive for as long as either half of a stream exists
/// (the client pool's stream slot).
pub(crate) type Guard = Arc<dyn Any + Send + Sync>;

/// A tunnelled byte stream: `AsyncRead + AsyncWrite`.
///
/// - `poll_shutdown` sends an empty DATA frame with END_STREAM (half-close);
///   reading continues.
/// - END_STREAM, or RST_STREAM with NO_ERROR or CANCEL, reads as EOF; other
///   resets are errors.
/// - Dropping the stream before both sides finished resets it with CANCEL.
pub struct TunnelStream {
    reader: TunnelReader,
    writer: TunnelWriter,
}

impl TunnelStream {
    pub(crate) fn new(send: SendStream<Chunk>, recv: RecvStream, guard: Option<Guard>) -> Self {
        Self {
            reader: TunnelReader { recv, pending: Bytes::new(), eof: false, _guard: guard.clone() },
            writer: TunnelWriter { send, shut_down: false, _guard: guard },
        }
    }

    /// Splits into independently usable halves (no lock between them: h2
    /// already separates the directions).
    pub fn into_split(self) -> (TunnelReader, TunnelWriter) {
        (self.reader, self.writer)
    }
}

impl std::fmt::Debug for TunnelStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelStream").field("stream_id", &self.writer.send.stream_id().as_u32()).finish_non_exhaustive()
    }
}

/// The receiving half of a [`TunnelStream`].
pub struct TunnelReader {
    recv: RecvStream,
    /// The not yet consumed rest of the last DATA frame.
    pending: Bytes,
    eof: bool,
    _guard: Option<Guard>,
}

impl TunnelReader {
    /// The next chunk of bytes as h2 received it (no copy), or `None` at end
    /// of stream. The chunk's window is returned to the peer at once: the
    /// caller holds at most this one chunk.
    pub fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        let chunk = ready!(self.poll_chunk_held(cx))?;
        if let Some(c) = &chunk {
            self.release(c.len());
        }
        Poll::Ready(Ok(chunk))
    }

    /// As [`Self::poll_chunk`], the chunk's window still held: the caller
    /// gives it back with [`Self::release`] as it writes the bytes out, so
    /// what the peer may send and we hold stays within the window.
    pub(crate) fn poll_chunk_held(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        ready!(self.fill(cx))?;
        if self.pending.is_empty() {
            return Poll::Ready(Ok(None));
        }
        Poll::Ready(Ok(Some(std::mem::take(&mut self.pending))))
    }

    /// [`Self::poll_chunk`] as a future.
    pub async fn chunk(&mut self) -> io::Result<Option<Bytes>> {
        std::future::poll_fn(|cx| self.poll_chunk(cx)).await
    }

    /// Waits until `pending` holds bytes or the stream ended.
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.pending.is_empty() && !self.eof {
            match ready!(self.recv.poll_data(cx)) {
                // Empty DATA frames without END_STREAM carry nothing.
                Some(Ok(data)) => self.pending = data,
                Some(Err(e)) => match recv_error(e) {
                    None => self.eof = true,
                    Some(err) => return Poll::Ready(Err(err)),
                },
                None => self.eof = true,
            }
        }
        Poll::Ready(Ok(()))
    }

    pub(crate) fn release(&mut self, n: usize) {
        if n > 0 {
            // Fails only if the stream is already gone; nothing to give back then.
            let _ = self.recv.flow_control().release_capacity(n);
        }
    }
}

impl AsyncRead for TunnelReader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        ready!(this.fill(cx))?;
        let n = this.pending.len().min(buf.remaining());
        if n > 0 {
            buf.put_slice(&this.pending.split_to(n));
            this.release(n);
        }
        Poll::Ready(Ok(()))
    }
}

/// Maps a receive error: `None` means "end of stream".
fn recv_error(e: h2::Error) -> Option<io::Error> {
    // RST_STREAM NO_ERROR or CANCEL is how peers (ztunnel included) end a
    // stream they no longer need: treat it like END_STREAM.
    if e.is_reset() && matches!(e.reason(), Some(Reason::NO_ERROR) | Some(Reason::CANCEL)) {
        return None;
    }
    Some(h2_to_io(e))
}

pub(crate) fn h2_to_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e.into_io().unwrap_or_else(|| io::Error::other("h2 I/O error"));
    }
    let kind = if e.is_reset() || e.is_go_away() { io::ErrorKind::ConnectionReset } else { io::ErrorKind::Other };
    io::Error::new(kind, e)
}

/// The sending half of a [`TunnelStream`].
pub struct TunnelWriter {
    send: SendStream<Chunk>,
    shut_down: bool,
    _guard: Option<Guard>,
}

impl TunnelWriter {
    /// Waits until the peer's window lets us send, and returns how many bytes
    /// (at most `want`, at most one maximum-size frame).
    pub(crate) fn poll_capacity(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        if self.shut_down {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, "write after shutdown")));
        }
        let want = want.min(MAX_WRITE_CHUNK);
        loop {
            let available = self.send.capacity();
            if available > 0 {
                return Poll::Ready(Ok(available.min(want)));
            }
            // `reserve_capacity` sets the total we want assigned; h2 assigns
            // it as the peer's stream and connection windows allow.
            self.send.reserve_capacity(want);
            match ready!(self.send.poll_capacity(cx)) {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Poll::Ready(Err(h2_to_io(e))),
                // The stream can no longer send: the peer reset it.
                None => return Poll::Ready(Err(self.closed_error(cx))),
            }
        }
    }

    fn closed_error(&mut self, cx: &mut Context<'_>) -> io::Error {
        let reason = match self.send.poll_reset(cx) {
            Poll::Ready(Ok(reason)) => format!("peer reset the stream: {reason}"),
            _ => "the stream is closed".to_owned(),
        };
        io::Error::new(io::ErrorKind::BrokenPipe, reason)
    }

    /// Sends `data` without copying it, waiting for window as needed.
    pub async fn send(&mut self, mut data: Bytes) -> io::Result<()> {
        while !data.is_empty() {
            let n = std::future::poll_fn(|cx| self.poll_capacity(cx, data.len())).await?;
            self.send.send_data(Chunk::from(data.split_to(n)), false).map_err(h2_to_io)?;
        }
        Ok(())
    }

    /// Hands `data` to h2 now; the caller got the capacity for it from
    /// [`Self::poll_capacity`].
    pub(crate) fn send_now(&mut self, data: Chunk) -> io::Result<()> {
        self.send.send_data(data, false).map_err(h2_to_io)
    }

    /// Half-closes: an empty DATA frame with END_STREAM.
    pub fn finish(&mut self) -> io::Result<()> {
        if self.shut_down {
            return Ok(());
        }
        self.shut_down = true;
        self.send.send_data(Chunk::default(), true).map_err(h2_to_io)
    }
}

impl AsyncWrite for TunnelWriter {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = ready!(this.poll_capacity(cx, buf.len()))?;
        this.send.send_data(Chunk::from(Bytes::copy_from_slice(&buf[..n])), false).map_err(h2_to_io)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // h2's connection task writes queued frames out on its own.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.get_mut().finish())
    }
}

impl AsyncRead for TunnelStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().reader).poll_read(cx, buf)
    }
}

impl AsyncWrite for TunnelStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().writer).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().writer).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().writer).poll_shutdown(cx)
    }
}
