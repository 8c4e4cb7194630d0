//! Graceful drain: one trigger, many watchers. Every listener and
//! connection holds a [`DrainWatch`]; [`DrainTrigger::drain`] tells them all
//! the same deadline and returns once every watcher is gone.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// Starts a drain.
#[derive(Debug)]
pub struct DrainTrigger {
    tx: watch::Sender<Option<Instant>>,
}

/// Learns that a drain started, and its hard deadline. Clone one per task
/// that must finish before the drain is complete; drop it when done.
#[derive(Debug, Clone)]
pub struct DrainWatch {
    rx: watch::Receiver<Option<Instant>>,
}

pub fn channel() -> (DrainTrigger, DrainWatch) {
    let (tx, rx) = watch::channel(None);
    (DrainTrigger { tx }, DrainWatch { rx })
}

impl DrainTrigger {
    /// Signals every watcher: stop taking new work, finish what is open
    /// within `grace`, then close. Resolves when all watchers are dropped.
    pub async fn drain(self, grace: Duration) {
        self.tx.send_replace(Some(Instant::now() + grace));
        self.tx.closed().await;
    }
}

impl DrainWatch {
    /// Resolves with the deadline once a drain has started. If the trigger is
    /// dropped without draining, never resolves: there is nothing to drain for.
    pub async fn signaled(&self) -> Instant {
        let mut rx = self.rx.clone();
        let deadline = rx.wait_for(Option::is_some).await.ok().and_then(|d| *d);
        match deadline {
            Some(deadline) => deadline,
            None => std::future::pending().await,
        }
    }
}
