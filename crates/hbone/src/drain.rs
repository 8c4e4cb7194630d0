//! Graceful drain, the same mechanism for every proxy: one trigger, many
//! watchers, and the stages a stop goes through, never back.
//!
//! - [`Stage::Serving`]: everything taken and served.
//! - [`Stage::Closing`]: still serving, new work included, but callers
//!   are told to move on between requests (the waypoint: HTTP/1 answers
//!   close their connection, HTTP/2 clients get GOAWAY). A proxy without
//!   such a period (the node proxy) goes straight to `Closed`.
//! - [`Stage::Closed`] ([`DrainTrigger::shut`]): listeners stop, HBONE
//!   connections get GOAWAY, open work has until the deadline
//!   ([`DrainTrigger::until_deadline`]); what is still open then is
//!   cancelled ([`Rest`]), and after a short force period
//!   ([`DrainTrigger::settle`]) the drain is over whatever is left.
//!
//! Every listener, connection and task that must end before the drain is
//! complete holds a [`DrainWatch`]; the drain waits for all of them.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// How far a graceful stop has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// Taking and serving everything.
    Serving,
    /// Serving, but telling callers to go elsewhere between requests.
    Closing,
    /// Listeners closed; open work finishes until the deadline.
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    stage: Stage,
    /// Set with `Closed`: when what is still open is cancelled.
    deadline: Option<Instant>,
}

/// Moves a drain on.
#[derive(Debug)]
pub struct DrainTrigger {
    tx: watch::Sender<State>,
}

/// Learns the drain's stage, and its hard deadline once closed. Clone one
/// per task that must finish before the drain is complete; drop it when
/// done.
#[derive(Debug, Clone)]
pub struct DrainWatch {
    rx: watch::Receiver<State>,
}

/// What a drain cancels at its deadline: the work still open that does
/// not end by itself (the node proxy's connections).
pub trait Rest: Sync {
    /// How much is still open.
    fn open(&self) -> usize;
    /// Cancels all of it; how many were cancelled.
    fn cancel(&self) -> usize;
}

/// Nothing to cancel: what is open ends with its watchers.
impl Rest for () {
    fn open(&self) -> usize {
        0
    }
    fn cancel(&self) -> usize {
        0
    }
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Still open after the force period.
    pub left: usize,
    /// Every watcher gone and nothing left: nothing was cut short.
    pub complete: bool,
}

/// How often a drain looks whether what is open has ended.
const POLL: Duration = Duration::from_millis(20);

/// A trigger and its first watcher.
pub fn channel() -> (DrainTrigger, DrainWatch) {
    let trigger = DrainTrigger::new();
    let watch = trigger.watch();
    (trigger, watch)
}

impl Default for DrainTrigger {
    fn default() -> Self {
        Self::new()
    }
}

impl DrainTrigger {
    /// Serving, with no watcher yet.
    pub fn new() -> DrainTrigger {
        DrainTrigger { tx: watch::Sender::new(State { stage: Stage::Serving, deadline: None }) }
    }

    /// A new watcher, counted until it is dropped.
    pub fn watch(&self) -> DrainWatch {
        DrainWatch { rx: self.tx.subscribe() }
    }

    pub fn stage(&self) -> Stage {
        self.tx.borrow().stage
    }

    /// Moves to `Closing` (never back); whether it moved.
    pub fn close(&self) -> bool {
        self.tx.send_if_modified(|s| {
            let later = s.stage < Stage::Closing;
            if later {
                s.stage = Stage::Closing;
            }
            later
        })
    }

    /// Moves to `Closed` with its deadline `grace` from now; a drain
    /// already closed keeps its deadline. Returns the deadline.
    pub fn shut(&self, grace: Duration) -> Instant {
        let mut deadline = Instant::now() + grace;
        self.tx.send_if_modified(|s| match s.deadline {
            Some(d) => {
                deadline = d;
                false
            }
            None => {
                *s = State { stage: Stage::Closed, deadline: Some(deadline) };
                true
            }
        });
        deadline
    }

    /// Shuts (`grace` to finish), then resolves when every watcher is
    /// gone.
    pub async fn drain(self, grace: Duration) {
        self.shut(grace);
        self.tx.closed().await;
    }

    /// Once shut: waits until every watcher is gone and `rest` holds
    /// nothing, or the deadline; then cancels what `rest` still holds.
    /// Returns how many it cancelled.
    pub async fn until_deadline(&self, rest: &dyn Rest) -> usize {
        let deadline = self.tx.borrow().deadline.unwrap_or_else(Instant::now);
        if self.settled(deadline, rest).await || rest.open() == 0 {
            return 0;
        }
        rest.cancel()
    }

    /// After [`Self::until_deadline`]: waits up to `force` more for the
    /// same, and says how the drain ended.
    pub async fn settle(&self, force: Duration, rest: &dyn Rest) -> Drained {
        let complete = self.settled(Instant::now() + force, rest).await;
        Drained { left: rest.open(), complete }
    }

    /// Waits until nothing is open (true) or `until` (false).
    async fn settled(&self, until: Instant, rest: &dyn Rest) -> bool {
        loop {
            let idle = rest.open() == 0;
            if idle && self.tx.receiver_count() == 0 {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            tokio::select! {
                () = self.tx.closed(), if idle => {}
                () = tokio::time::sleep(POLL.min(until - now)) => {}
            }
        }
    }
}

impl DrainWatch {
    pub fn stage(&self) -> Stage {
        self.rx.borrow().stage
    }

    /// Resolves with the deadline once the drain is closed. If the trigger
    /// is dropped without closing, never resolves: there is nothing to
    /// drain for.
    pub async fn signaled(&self) -> Instant {
        let mut rx = self.rx.clone();
        let deadline = rx.wait_for(|s| s.deadline.is_some()).await.ok().and_then(|s| s.deadline);
        match deadline {
            Some(deadline) => deadline,
            None => std::future::pending().await,
        }
    }

    /// The stage, once it has changed since last seen (or since
    /// [`Self::mark_changed`]); None when the trigger is gone.
    pub async fn changed(&mut self) -> Option<Stage> {
        self.rx.changed().await.ok()?;
        Some(self.rx.borrow_and_update().stage)
    }

    /// The next [`Self::changed`] resolves at once, with the stage then.
    pub fn mark_changed(&mut self) {
        self.rx.mark_changed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Open work that ends when cancelled, or on its own.
    #[derive(Default)]
    struct Open {
        n: AtomicUsize,
        cancelled: AtomicUsize,
    }

    impl Rest for Open {
        fn open(&self) -> usize {
            self.n.load(Ordering::Relaxed)
        }
        fn cancel(&self) -> usize {
            let n = self.n.swap(0, Ordering::Relaxed);
            self.cancelled.fetch_add(n, Ordering::Relaxed);
            n
        }
    }

    #[tokio::test]
    async fn stages_move_on_never_back() {
        let (t, mut w) = channel();
        assert_eq!((t.stage(), w.stage()), (Stage::Serving, Stage::Serving));
        assert!(t.close());
        assert_eq!(w.changed().await, Some(Stage::Closing));
        assert!(!t.close(), "already closing");
        let deadline = t.shut(Duration::from_secs(5));
        assert_eq!(w.changed().await, Some(Stage::Closed));
        assert_eq!(w.signaled().await, deadline);
        assert!(!t.close(), "never back");
        assert_eq!(t.shut(Duration::from_secs(60)), deadline, "the first deadline stays");
        assert_eq!(t.stage(), Stage::Closed);
        // A watcher made after the fact sees where the drain is.
        let mut late = t.watch();
        assert_eq!(late.stage(), Stage::Closed);
        late.mark_changed();
        assert_eq!(late.changed().await, Some(Stage::Closed));
        drop(t);
        assert_eq!(w.changed().await, None);
    }

    #[tokio::test]
    async fn what_ends_in_the_grace_period_is_not_cancelled() {
        let (t, w) = channel();
        let open = Arc::new(Open::default());
        open.n.store(2, Ordering::Relaxed);
        let ending = open.clone();
        tokio::spawn(async move {
            let _w = w;
            tokio::time::sleep(Duration::from_millis(300)).await;
            ending.n.store(0, Ordering::Relaxed);
        });
        let start = Instant::now();
        t.shut(Duration::from_secs(2));
        assert_eq!(t.until_deadline(&*open).await, 0);
        assert!(start.elapsed() < Duration::from_millis(400), "{:?}", start.elapsed());
        assert_eq!(t.settle(Duration::from_millis(500), &*open).await, Drained { left: 0, complete: true });
    }

    #[tokio::test]
    async fn at_the_deadline_the_rest_is_cancelled() {
        let (t, w) = channel();
        let open = Open::default();
        open.n.store(3, Ordering::Relaxed);
        // The watcher goes when its work is cancelled.
        drop(w);
        let start = Instant::now();
        t.shut(Duration::from_millis(300));
        assert_eq!(t.until_deadline(&open).await, 3);
        assert!(start.elapsed() >= Duration::from_millis(300));
        assert_eq!(open.cancelled.load(Ordering::Relaxed), 3);
        assert_eq!(t.settle(Duration::from_millis(500), &open).await, Drained { left: 0, complete: true });
    }

    #[tokio::test]
    async fn a_watcher_that_stays_past_the_force_period_leaves_it_incomplete() {
        let (t, w) = channel();
        let start = Instant::now();
        t.shut(Duration::from_millis(300));
        assert_eq!(t.until_deadline(&()).await, 0);
        let d = t.settle(Duration::from_millis(500), &()).await;
        assert_eq!(d, Drained { left: 0, complete: false });
        assert!(start.elapsed() >= Duration::from_millis(800));
        drop(w);
        assert!(t.settle(Duration::from_millis(500), &()).await.complete);
    }

    #[tokio::test]
    async fn drain_resolves_once_every_watcher_is_gone() {
        let (t, w) = channel();
        let w2 = w.clone();
        let done = tokio::spawn(t.drain(Duration::from_secs(5)));
        let _ = w.signaled().await;
        drop(w);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!done.is_finished(), "one watcher left");
        drop(w2);
        tokio::time::timeout(Duration::from_secs(5), done).await.unwrap().unwrap();
    }
}
