//! Helpers shared by the identity integration tests.
#![allow(dead_code)] // each test binary uses a different subset

use std::fmt::Display;
use std::time::Duration;

/// How long a test waits for something that is about to happen (a
/// background renewal, a retry) before it fails.
pub const WAIT: Duration = Duration::from_secs(10);

/// Waits until `done` holds, checking every 10 ms without blocking the
/// runtime. If it still does not after `within`, panics saying what never
/// happened: "timed out after 10s waiting for {what}". Tests use it instead
/// of sleeping whenever they need something to have happened.
pub async fn wait_until_async(what: impl Display, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
