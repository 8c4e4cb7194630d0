//! The open connections of one pod, each with a cancellation handle: how a
//! policy change closes the connections it now denies, and how a drain
//! closes what is still open at its deadline.
//!
//! A handle is a shared cell (a state and a waker). Cancelling sets the
//! state and wakes the connection's task; the task polls the cell together
//! with its copy (whatever the copy waits for: a stalled peer, a half-closed
//! side), drops the copy, which closes its sockets, and its record closes
//! with the reason. Nothing outside the task touches its sockets.

use futures_util::task::AtomicWaker;
use slipstream_core::sync::LockExt;
use slipstream_proxy::authz::AuthzKey;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Context;

/// Why a connection was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Cancelled {
    /// A policy change denies it.
    Revoked = 1,
    /// It was still open at the drain deadline.
    Drained = 2,
}

#[derive(Debug, Default)]
pub struct CancelCell {
    state: AtomicU8,
    waker: AtomicWaker,
}

impl CancelCell {
    pub fn cancel(&self, why: Cancelled) {
        // The first reason wins.
        let _ = self.state.compare_exchange(0, why as u8, Ordering::AcqRel, Ordering::Acquire);
        self.waker.wake();
    }

    pub fn cancelled(&self) -> Option<Cancelled> {
        match self.state.load(Ordering::Acquire) {
            0 => None,
            1 => Some(Cancelled::Revoked),
            _ => Some(Cancelled::Drained),
        }
    }

    /// Whether cancelled; if not, the task in `cx` is woken when it is.
    pub fn poll_cancelled(&self, cx: &mut Context<'_>) -> Option<Cancelled> {
        if let Some(c) = self.cancelled() {
            return Some(c);
        }
        self.waker.register(cx.waker());
        self.cancelled()
    }
}

#[derive(Debug)]
struct Entry {
    cell: Arc<CancelCell>,
    /// None: nothing to decide again (a connection no policy governs).
    authz: Option<AuthzKey>,
}

/// One pod's open connections.
#[derive(Debug, Default)]
pub struct Conns {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Entry>>,
}

/// A connection's place in [`Conns`]: removed when dropped.
#[derive(Debug)]
pub struct Registration {
    id: u64,
    conns: Arc<Conns>,
    cell: Arc<CancelCell>,
}

impl Registration {
    pub fn cell(&self) -> &CancelCell {
        &self.cell
    }

    /// The cancellation handle, shared (to poll it beside a copy that
    /// borrows the stream).
    pub fn handle(&self) -> Arc<CancelCell> {
        self.cell.clone()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.conns.open.locked().remove(&self.id);
    }
}

impl Conns {
    pub fn register(self: &Arc<Self>, authz: Option<AuthzKey>) -> Registration {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let cell = Arc::new(CancelCell::default());
        self.open.locked().insert(id, Entry { cell: cell.clone(), authz });
        Registration { id, conns: self.clone(), cell }
    }

    pub fn len(&self) -> usize {
        self.open.locked().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Cancels every open inbound connection `still_allowed` now refuses;
    /// returns how many. The connections close themselves, with DENY.
    pub fn revoke(&self, still_allowed: impl Fn(&AuthzKey) -> Result<(), Arc<str>>) -> usize {
        let open = self.open.locked();
        let mut closed = 0;
        for e in open.values() {
            let Some(key) = &e.authz else { continue };
            if let Err(why) = still_allowed(key) {
                tracing::info!(src = %key.src, dst = %key.dst, peer = ?key.peer.as_ref().map(|p| p.to_string()), "closing an open connection the new policy denies: {why}");
                e.cell.cancel(Cancelled::Revoked);
                closed += 1;
            }
        }
        closed
    }

    /// Cancels every open connection (the drain deadline); returns how many.
    pub fn cancel_all(&self, why: Cancelled) -> usize {
        let open = self.open.locked();
        for e in open.values() {
            e.cell.cancel(why);
        }
        open.len()
    }
}

/// What a drain cancels at its deadline: every connection still open.
impl slipstream_hbone::drain::Rest for Conns {
    fn open(&self) -> usize {
        self.len()
    }
    fn cancel(&self) -> usize {
        self.cancel_all(Cancelled::Drained)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn key(port: u16) -> AuthzKey {
        AuthzKey {
            peer: None,
            src: "10.0.0.1:4000".parse().unwrap(),
            dst: SocketAddr::new("10.0.0.2".parse().unwrap(), port),
            outbound: false,
        }
    }

    #[test]
    fn revoke_cancels_only_what_is_now_denied_and_registrations_leave() {
        let conns = Arc::new(Conns::default());
        let a = conns.register(Some(key(80)));
        let b = conns.register(Some(key(81)));
        let out = conns.register(None);
        assert_eq!(conns.len(), 3);
        let n = conns.revoke(|k| if k.dst.port() == 81 { Err("denied".into()) } else { Ok(()) });
        assert_eq!(n, 1);
        assert_eq!((a.cell().cancelled(), b.cell().cancelled(), out.cell().cancelled()), (None, Some(Cancelled::Revoked), None));
        assert_eq!(conns.cancel_all(Cancelled::Drained), 3);
        assert_eq!(b.cell().cancelled(), Some(Cancelled::Revoked), "the first reason wins");
        assert_eq!(a.cell().cancelled(), Some(Cancelled::Drained));
        drop((a, b, out));
        assert!(conns.is_empty());
    }

    #[tokio::test]
    async fn cancelling_wakes_the_waiting_task() {
        use std::task::Poll;
        let conns = Arc::new(Conns::default());
        let r = conns.register(None);
        let cell = r.cell.clone();
        let cell2 = cell.clone();
        let waiter = tokio::spawn(futures_util::future::poll_fn(move |cx| match cell2.poll_cancelled(cx) {
            Some(c) => Poll::Ready(c),
            None => Poll::Pending,
        }));
        tokio::task::yield_now().await;
        cell.cancel(Cancelled::Drained);
        assert_eq!(tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await.unwrap().unwrap(), Cancelled::Drained);
    }
}
