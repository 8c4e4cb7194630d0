//! Shards: one single-threaded runtime per thread, each serving its own
//! connections with its own pooled HBONE connections.
//!
//! A multi-threaded runtime spreads one burst of requests over its threads,
//! but every stream of a pooled HTTP/2 connection then shares that
//! connection's lock and wakes tasks on the other thread. Measured on the
//! `l7` path, a node proxy on tokio's work-stealing runtime with two
//! threads spent a fifth or more CPU per request than as two shards
//! (docs/node-proxy.md, "Where the time goes"). Each accepted connection is
//! handed to one shard, round robin, and stays there with everything it
//! opens (its tunnel, the pooled connection that tunnel rides, their
//! tasks): no lock or wake-up crosses threads on the data path, and a
//! burst still spreads over the cores.
//!
//! Without [`start`] there is one shard, the caller's runtime: every
//! connection is spawned where it was accepted.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use tokio::net::TcpStream;
use tokio::runtime::Handle;

thread_local! {
    static CURRENT: Cell<u16> = const { Cell::new(0) };
}

/// The other shards' runtimes (shard 0 is the runtime that accepts).
static OTHERS: OnceLock<Vec<Handle>> = OnceLock::new();
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The shard of the calling thread: 0 outside shard threads.
pub fn current() -> u16 {
    CURRENT.with(Cell::get)
}

/// Starts `threads - 1` shard threads beside the caller's, each running a
/// single-threaded runtime until the process exits. The caller's own
/// runtime must be single-threaded too (it is shard 0). Once per process;
/// later calls are ignored.
pub fn start(threads: usize) -> std::io::Result<()> {
    if OTHERS.get().is_some() || threads <= 1 {
        return Ok(());
    }
    let mut handles = Vec::with_capacity(threads - 1);
    for i in 1..threads {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        handles.push(rt.handle().clone());
        let shard = i as u16;
        std::thread::Builder::new().name(format!("shard-{i}")).spawn(move || {
            CURRENT.with(|c| c.set(shard));
            rt.block_on(std::future::pending::<()>());
        })?;
    }
    let _ = OTHERS.set(handles);
    Ok(())
}

/// How many shards serve connections.
pub fn count() -> usize {
    OTHERS.get().map_or(1, |o| o.len() + 1)
}

/// Serves an accepted connection on the next shard: `serve` runs there,
/// with the socket registered with that shard's reactor.
pub fn spawn_accepted<F, Fut>(tcp: TcpStream, serve: F)
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let others = match OTHERS.get() {
        Some(o) if !o.is_empty() => o,
        _ => {
            tokio::spawn(serve(tcp));
            return;
        }
    };
    let n = NEXT.fetch_add(1, Ordering::Relaxed) % (others.len() + 1);
    if n == 0 {
        tokio::spawn(serve(tcp));
        return;
    }
    // The socket moves to the other shard's reactor.
    let std = match tcp.into_std() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("moving an accepted connection to shard {n}: {e}");
            return;
        }
    };
    others[n - 1].spawn(async move {
        match TcpStream::from_std(std) {
            Ok(tcp) => serve(tcp).await,
            Err(e) => tracing::warn!("registering an accepted connection on shard {n}: {e}"),
        }
    });
}
