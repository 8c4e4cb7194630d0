//! Open inbound connections, so that a policy change applies to them too
//! (shared/PROTOCOLS.md section 2: a connection the new policy denies is
//! closed).
//!
//! Entries keep the app-side socket's raw descriptor, not a duplicate: a
//! duplicate per connection would double the proxy's descriptors (10k
//! connections would need 20k). Safety of the raw descriptor rests on one
//! rule: an entry is removed, under the lock, before its socket is closed
//! (`Registration` is dropped first by its owner), and `revoke` only uses
//! descriptors under that same lock.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub struct Tracked {
    pub pod_uid: String,
    /// Verified peer principal (no `spiffe://`); None for plaintext.
    pub principal: Option<String>,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    fd: RawFd,
}

#[derive(Default)]
pub struct Tracker {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Tracked>>,
}

/// Removes its entry when dropped; must be dropped before the socket.
pub struct Registration {
    id: u64,
    tracker: Arc<Tracker>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.tracker.open.lock().expect("tracker lock").remove(&self.id);
    }
}

impl Tracker {
    pub fn register(
        self: &Arc<Self>,
        app: &tokio::net::TcpStream,
        pod_uid: &str,
        principal: Option<String>,
        src: SocketAddr,
        dst: SocketAddr,
    ) -> Registration {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let t = Tracked { pod_uid: pod_uid.to_string(), principal, src, dst, fd: app.as_raw_fd() };
        self.open.lock().expect("tracker lock").insert(id, t);
        Registration { id, tracker: self.clone() }
    }

    pub fn len(&self) -> usize {
        self.open.lock().expect("tracker lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resets every open connection `still_allowed` now refuses; returns how
    /// many were closed.
    pub fn revoke(&self, still_allowed: impl Fn(&Tracked) -> Result<(), String>) -> usize {
        let open = self.open.lock().expect("tracker lock");
        let mut closed = 0;
        for t in open.values() {
            if let Err(why) = still_allowed(t) {
                tracing::info!(src = %t.src, dst = %t.dst, principal = t.principal.as_deref().unwrap_or("-"), "closing an open connection the new policy denies: {why}");
                if let Err(e) = crate::sys::sockopt::shutdown_fd(t.fd) {
                    tracing::warn!(src = %t.src, dst = %t.dst, "closing a revoked connection failed: {e}");
                }
                closed += 1;
            }
        }
        closed
    }
}
