//! One write per scheduler pass on an HBONE connection.
//!
//! h2 flushes its connection whenever its task is polled with frames queued.
//! When the answers of many tunnels become ready together (a burst of
//! requests, one response per stream), each would reach the socket in its
//! own TLS record and `writev(2)`, and the kernel's per-write cost (with the
//! receiver's softirq work, charged to the writer on a local path) is most
//! of what a small request costs a proxy (docs/waypoint.md, "Where the time goes").
//!
//! [`Coalesce`] sits between h2 and TLS. Small writes are gathered in a
//! buffer; the first `poll_flush` with something gathered wakes its own task
//! and returns `Pending` once, so the other tasks already scheduled (the
//! streams answering in the same burst) queue their frames first; the next
//! `poll_flush` writes them all as one record and one system call. This is
//! what Envoy does by writing a connection's buffer once per event-loop
//! iteration. A lone request pays one extra poll of the connection task, not
//! a timer: nothing waits for more data to arrive.
//!
//! Large writes (bulk transfer) are not copied: what is gathered goes first,
//! then the large write is passed through as it is.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Writes at least this large go to the inner stream without a copy.
pub const DIRECT: usize = 4 * 1024;
/// At most this much is gathered before it is written.
pub const LIMIT: usize = 64 * 1024;

pub struct Coalesce<S> {
    inner: S,
    buf: Vec<u8>,
    /// How much of `buf` the inner stream has taken.
    written: usize,
    /// The current gathering has yielded once already: the next flush writes.
    deferred: bool,
}

impl<S> Coalesce<S> {
    pub fn new(inner: S) -> Self {
        Coalesce { inner, buf: Vec::new(), written: 0, deferred: false }
    }

    fn pending(&self) -> usize {
        self.buf.len() - self.written
    }
}

impl<S: AsyncWrite + Unpin> Coalesce<S> {
    /// Gives everything gathered to the inner stream.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.buf.clear();
        self.written = 0;
        // A connection that once sent a burst does not keep its buffer.
        if self.buf.capacity() > LIMIT {
            self.buf = Vec::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Coalesce<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesce<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total >= DIRECT {
            ready!(this.drain(cx))?;
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        }
        if this.pending() + total > LIMIT {
            ready!(this.drain(cx))?;
        }
        for b in bufs {
            this.buf.extend_from_slice(b);
        }
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pending() > 0 && !this.deferred {
            // Let the tasks already scheduled add theirs first.
            this.deferred = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        ready!(this.drain(cx))?;
        this.deferred = false;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_core::sync::LockExt;
    use std::sync::{Arc, Mutex};

    /// Records each write the inner stream is given.
    #[derive(Default, Clone)]
    struct Recorder(Arc<Mutex<Vec<Vec<u8>>>>);

    impl AsyncWrite for Recorder {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            self.0.locked().push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn writes(r: &Recorder) -> Vec<usize> {
        r.0.locked().iter().map(Vec::len).collect()
    }

    #[test]
    fn small_writes_go_out_together_on_the_second_flush() {
        let rec = Recorder::default();
        let mut c = Coalesce::new(rec.clone());
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        for _ in 0..3 {
            assert!(matches!(Pin::new(&mut c).poll_write(&mut cx, &[1; 100]), Poll::Ready(Ok(100))));
        }
        assert!(Pin::new(&mut c).poll_flush(&mut cx).is_pending(), "the first flush yields");
        assert!(writes(&rec).is_empty());
        // Another stream's frame, queued while the connection yielded.
        assert!(matches!(
            Pin::new(&mut c).poll_write_vectored(&mut cx, &[io::IoSlice::new(&[2; 9]), io::IoSlice::new(&[3; 50])]),
            Poll::Ready(Ok(59))
        ));
        assert!(matches!(Pin::new(&mut c).poll_flush(&mut cx), Poll::Ready(Ok(()))));
        assert_eq!(writes(&rec), [359], "one write for all of them");
        let all = rec.0.locked()[0].clone();
        assert_eq!((&all[..300], &all[300..309], &all[309..]), (&[1u8; 300][..], &[2u8; 9][..], &[3u8; 50][..]), "in order");
        // Nothing gathered: a flush does not yield.
        assert!(matches!(Pin::new(&mut c).poll_flush(&mut cx), Poll::Ready(Ok(()))));
    }

    #[test]
    fn large_writes_pass_through_after_what_is_gathered() {
        let rec = Recorder::default();
        let mut c = Coalesce::new(rec.clone());
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        assert!(Pin::new(&mut c).poll_write(&mut cx, &[1; 9]).is_ready());
        assert!(matches!(Pin::new(&mut c).poll_write(&mut cx, &vec![2; DIRECT]), Poll::Ready(Ok(n)) if n == DIRECT));
        assert_eq!(writes(&rec), [9, DIRECT]);
        // The limit: gathering stops at LIMIT bytes.
        for _ in 0..(LIMIT / 1000) {
            assert!(Pin::new(&mut c).poll_write(&mut cx, &[3; 1000]).is_ready());
        }
        assert_eq!(writes(&rec).len(), 2);
        assert!(Pin::new(&mut c).poll_write(&mut cx, &[3; 1000]).is_ready());
        assert_eq!(writes(&rec)[2], (LIMIT / 1000) * 1000, "written when the next would pass the limit");
        assert!(matches!(Pin::new(&mut c).poll_shutdown(&mut cx), Poll::Ready(Ok(()))));
        assert_eq!(writes(&rec)[3], 1000, "shutdown writes what is left");
    }
}
