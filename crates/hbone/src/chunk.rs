//! Bytes handed to h2 for sending, carrying what they hold of a memory
//! budget.
//!
//! h2 queues what a stream sends until its connection task has written it
//! out (up to `max_send_buffer` per stream): that queue, not our read
//! buffer, is where a fast sender's bytes wait when the connection is
//! slower than the pods writing into it. Each [`Chunk`] carries a
//! [`Lease`]; h2 drops the chunk once written (or when the stream is
//! reset), and the lease gives its bytes back to the budget and counts
//! the stream's chunks in flight down, waking the copy that waits for them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use futures_util::task::AtomicWaker;

/// Memory a connection's copy may take for what it has read and not yet
/// seen written out: the node proxy's budget, shared fairly by its pods
/// (`proxy::limits::Buffers`). Bytes taken are given back when h2 has
/// written them or the copy ends.
pub trait BufferBudget: Send + Sync {
    /// `bytes` more for this connection, if the budget allows.
    fn take(&self, bytes: usize) -> bool;
    /// `bytes` given back.
    fn give(&self, bytes: usize);
}

/// One stream's chunks still in h2's send queue, and the budget they
/// hold bytes of (one place for both: a chunk carries one pointer).
pub(crate) struct InFlight {
    chunks: AtomicUsize,
    waker: AtomicWaker,
    pub(crate) budget: Arc<dyn BufferBudget>,
}

impl InFlight {
    pub(crate) fn new(budget: Arc<dyn BufferBudget>) -> InFlight {
        InFlight { chunks: AtomicUsize::new(0), waker: AtomicWaker::new(), budget }
    }

    /// Ready once nothing of this stream waits in h2.
    pub(crate) fn poll_drained(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.chunks.load(Ordering::Acquire) == 0 {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        // Drained between the load and the registration: no wake will come.
        if self.chunks.load(Ordering::Acquire) == 0 {
            return Poll::Ready(());
        }
        Poll::Pending
    }

    pub(crate) fn is_drained(&self) -> bool {
        self.chunks.load(Ordering::Acquire) == 0
    }
}

/// What a [`Chunk`] holds: its place among its stream's chunks in flight,
/// and bytes of their budget (zero for the one small chunk a stream may
/// send without).
pub(crate) struct Lease {
    in_flight: Arc<InFlight>,
    bytes: usize,
}

impl Lease {
    pub(crate) fn new(in_flight: &Arc<InFlight>, bytes: usize) -> Lease {
        in_flight.chunks.fetch_add(1, Ordering::AcqRel);
        Lease { in_flight: in_flight.clone(), bytes }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.in_flight.budget.give(self.bytes);
        }
        if self.in_flight.chunks.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.in_flight.waker.wake();
        }
    }
}

/// Bytes for h2 to send, and what they hold until h2 drops them.
pub struct Chunk {
    bytes: Bytes,
    lease: Option<Lease>,
}

impl Chunk {
    pub(crate) fn leased(bytes: Bytes, lease: Lease) -> Chunk {
        Chunk { bytes, lease: Some(lease) }
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The first `n` bytes as a chunk of their own, counted in flight but
    /// holding no budget: the allocation they share is held by the rest,
    /// which h2 sends (and drops) after them.
    pub(crate) fn split_to(&mut self, n: usize) -> Chunk {
        let head = self.bytes.split_to(n);
        let lease = self.lease.as_ref().map(|l| Lease::new(&l.in_flight, 0));
        Chunk { bytes: head, lease }
    }
}

impl Default for Chunk {
    fn default() -> Self {
        Chunk { bytes: Bytes::new(), lease: None }
    }
}

impl From<Bytes> for Chunk {
    fn from(bytes: Bytes) -> Self {
        Chunk { bytes, lease: None }
    }
}

impl Buf for Chunk {
    fn remaining(&self) -> usize {
        self.bytes.len()
    }

    fn chunk(&self) -> &[u8] {
        &self.bytes
    }

    fn advance(&mut self, cnt: usize) {
        self.bytes.advance(cnt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[derive(Default)]
    struct Counted(AtomicUsize);
    impl BufferBudget for Counted {
        fn take(&self, bytes: usize) -> bool {
            self.0.fetch_add(bytes, Ordering::Relaxed);
            true
        }
        fn give(&self, bytes: usize) {
            self.0.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_chunk_gives_its_bytes_back_when_dropped_and_its_parts_count_in_flight() {
        let budget = Arc::new(Counted::default());
        let in_flight = Arc::new(InFlight::new(budget.clone()));
        assert!(budget.take(100));
        let mut c = Chunk::leased(Bytes::from(vec![7u8; 100]), Lease::new(&in_flight, 100));
        let head = c.split_to(40);
        assert_eq!((head.remaining(), c.remaining()), (40, 60));
        assert_eq!(in_flight.chunks.load(Ordering::Relaxed), 2);
        drop(head);
        assert_eq!(budget.0.load(Ordering::Relaxed), 100, "the head holds no budget");
        assert!(!in_flight.is_drained());
        drop(c);
        assert_eq!(budget.0.load(Ordering::Relaxed), 0);
        assert!(in_flight.is_drained());
    }
}
