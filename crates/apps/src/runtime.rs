//! The process shell shared by `run_echo` and `run_bookinfo`: a small runtime
//! and a wait for the signals a pod is stopped with.

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};

/// Two workers: sample apps share a small machine with the whole mesh, and
/// two are enough to serve HTTP/2 and the TCP echo concurrently.
const WORKERS: usize = 2;

/// Runs `serve` on a fresh multi-thread runtime until SIGTERM or SIGINT, then
/// returns `Ok(())` so the process exits 0. `serve` should bind its listeners
/// first and fail early; if it ever returns, its result is returned.
pub(crate) fn run_until_signal<F>(serve: F) -> anyhow::Result<()>
where
    F: Future<Output = anyhow::Result<()>>,
{
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(WORKERS).enable_all().build().context("building the tokio runtime")?;
    let result = rt.block_on(async {
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        tokio::select! {
            res = serve => res,
            _ = term.recv() => Ok(()),
            _ = int.recv() => Ok(()),
        }
    });
    // Connection tasks are cut off rather than drained: a sample app stopped
    // by `slipstream down` should go away at once.
    rt.shutdown_timeout(Duration::from_millis(200));
    result
}
