//! The HBONE connection pool.
//!
//! Per key it keeps HTTP/2 connections and opens CONNECT streams on them:
//! a connection takes new streams until it carries `max_streams_per_connection`,
//! then another is opened; at most one dial per key is in flight and every
//! caller waiting for it shares its result; a connection with no stream for
//! `idle_timeout` is closed.
//!
//! Keys are per shard ([`crate::shard`]): a tunnel opened on one shard's
//! thread rides a connection of that shard, whose task runs on the same
//! thread, so no lock or wake-up of the data path crosses threads. With
//! N shards a busy key has up to N connections.

use slipstream_core::sync::LockExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use h2::client::SendRequest;
use http::StatusCode;
use tokio::sync::watch;

use super::dial::{dial, CertSource, H2Connection, TlsErrorSlot};
use super::request::{ConnectRequest, PoolKey};
use crate::chunk::Chunk;
use crate::connector::Connector;
use crate::error::{HboneError, TimeoutStage};
use crate::h2config::{keepalive, H2Config};
use crate::stream::TunnelStream;

/// Pool behaviour. Defaults follow docs/protocols.md section 2.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Streams one connection carries before another is opened.
    pub max_streams_per_connection: usize,
    /// A connection without streams for this long is closed.
    pub idle_timeout: Duration,
    /// Budget for TCP + TLS + HTTP/2 handshakes.
    pub connect_timeout: Duration,
    /// How long to wait for the answer to a CONNECT. The peer itself gives
    /// the application 10 s to accept, so this must be longer.
    pub response_timeout: Duration,
    pub h2: H2Config,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            max_streams_per_connection: 100,
            idle_timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(10),
            response_timeout: Duration::from_secs(15),
            h2: H2Config::default(),
        }
    }
}

/// Opens tunnels, sharing connections. Clones share one pool.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

/// One connection of a [`PoolSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionSnapshot {
    pub id: u64,
    pub active_streams: usize,
}

/// The pool's connections per key, for an admin dump and for tests.
#[derive(Debug, Clone)]
pub struct PoolSnapshot {
    pub key: PoolKey,
    /// The shard whose tunnels ride these connections ([`crate::shard`]).
    pub shard: u16,
    pub connections: Vec<ConnectionSnapshot>,
}

type DialOutcome = Option<Result<Arc<PooledConn>, HboneError>>;

struct PoolInner {
    config: PoolConfig,
    certs: Arc<dyn CertSource>,
    connector: Arc<dyn Connector>,
    /// Per key and shard ([`crate::shard`]): a shard's tunnels ride only
    /// its own connections.
    keys: Mutex<HashMap<(PoolKey, u16), KeyState>>,
    next_id: AtomicU64,
}

#[derive(Default)]
struct KeyState {
    conns: Vec<Arc<PooledConn>>,
    /// Set while a dial for this key is in flight; resolves to its outcome.
    dialing: Option<watch::Receiver<DialOutcome>>,
}

struct PooledConn {
    id: u64,
    send: SendRequest<Chunk>,
    /// Streams open (or being opened) on this connection. Only incremented
    /// under the pool lock, so the idle check under the lock is exact.
    active: watch::Sender<usize>,
    /// No new streams: the connection is closing, broke, or got GOAWAY.
    closed: Arc<AtomicBool>,
    tls_error: TlsErrorSlot,
}

impl PooledConn {
    fn is_usable(&self, max: usize) -> bool {
        !self.closed.load(Ordering::Acquire) && *self.active.borrow() < max
    }
}

/// A reserved stream on a connection; released when the tunnel is dropped.
struct Slot {
    conn: Arc<PooledConn>,
}

impl Slot {
    fn reserve(conn: &Arc<PooledConn>) -> Self {
        conn.active.send_modify(|n| *n += 1);
        Self { conn: conn.clone() }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.conn.active.send_modify(|n| *n -= 1);
    }
}

impl Pool {
    pub fn new(config: PoolConfig, certs: Arc<dyn CertSource>, connector: Arc<dyn Connector>) -> Self {
        Self { inner: Arc::new(PoolInner { config, certs, connector, keys: Mutex::new(HashMap::new()), next_id: AtomicU64::new(1) }) }
    }

    /// Opens a tunnel: a CONNECT stream on a pooled connection for `key`.
    /// Fails with the peer's status if it answers anything but 200.
    pub async fn connect(&self, key: &PoolKey, request: ConnectRequest) -> Result<TunnelStream, HboneError> {
        // A stream refused by GOAWAY never reached the peer's application,
        // so it is retried once on another connection.
        let mut retried = false;
        loop {
            let slot = self.checkout(key).await?;
            match open_stream(&slot.conn, &request, key, &self.inner.config).await {
                Ok((send, recv)) => return Ok(TunnelStream::new(send, recv, Some(Arc::new(slot)))),
                Err(e) => {
                    if breaks_connection(&e) {
                        slot.conn.closed.store(true, Ordering::Release);
                    }
                    if e.is_retryable() && !retried {
                        retried = true;
                        continue;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Connections per key and shard with their stream counts.
    pub fn snapshot(&self) -> Vec<PoolSnapshot> {
        self.inner
            .lock()
            .iter()
            .map(|((key, shard), state)| PoolSnapshot {
                key: key.clone(),
                shard: *shard,
                connections: state.conns.iter().map(|c| ConnectionSnapshot { id: c.id, active_streams: *c.active.borrow() }).collect(),
            })
            .collect()
    }

    /// Total open connections.
    pub fn connection_count(&self) -> usize {
        self.inner.lock().values().map(|s| s.conns.len()).sum()
    }

    /// Reserves a stream slot on a connection with room, dialing when none
    /// has room and no dial is already under way.
    async fn checkout(&self, key: &PoolKey) -> Result<Slot, HboneError> {
        let max = self.inner.config.max_streams_per_connection;
        let key = (key.clone(), crate::shard::current());
        loop {
            let mut dialing = {
                let mut keys = self.inner.lock();
                let state = keys.entry(key.clone()).or_default();
                state.conns.retain(|c| !c.closed.load(Ordering::Acquire));
                if let Some(conn) = state.conns.iter().find(|c| c.is_usable(max)) {
                    return Ok(Slot::reserve(conn));
                }
                match &state.dialing {
                    Some(rx) => rx.clone(),
                    None => {
                        let (tx, rx) = watch::channel(None);
                        state.dialing = Some(rx.clone());
                        // The dial runs on its own task: a caller that gives
                        // up does not abort it for the others waiting on it.
                        tokio::spawn(self.inner.clone().dial_and_add(key.clone(), tx));
                        rx
                    }
                }
            };
            let outcome = dialing.wait_for(Option::is_some).await.map(|o| o.clone());
            match outcome {
                Ok(Some(Err(e))) => return Err(e),
                Ok(Some(Ok(conn))) => {
                    // Use the connection this dial produced even if it has
                    // already died: the stream then fails with its real
                    // error, instead of this caller dialing again and again
                    // against a peer that drops every connection.
                    let _keys = self.inner.lock();
                    if *conn.active.borrow() < max {
                        return Ok(Slot::reserve(&conn));
                    }
                    // Full: others took its streams; look for room again.
                }
                // The dial task vanished (runtime shutting down): retry.
                _ => {}
            }
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("connections", &self.connection_count()).finish_non_exhaustive()
    }
}

impl PoolInner {
    fn lock(&self) -> MutexGuard<'_, HashMap<(PoolKey, u16), KeyState>> {
        // Each critical section leaves the map consistent; ignore poisoning.
        self.keys.locked()
    }

    async fn dial_and_add(self: Arc<Self>, key: (PoolKey, u16), done: watch::Sender<DialOutcome>) {
        let dialed = tokio::time::timeout(self.config.connect_timeout, dial(&key.0, &*self.certs, &*self.connector, &self.config.h2))
            .await
            .unwrap_or(Err(HboneError::Timeout(TimeoutStage::Connect)));

        let mut keys = self.lock();
        let state = keys.entry(key.clone()).or_default();
        state.dialing = None;
        match dialed {
            Ok((send, mut connection, tls_error)) => {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let (active, active_rx) = watch::channel(0);
                let closed = Arc::new(AtomicBool::new(false));
                let ping_pong = connection.ping_pong();
                tokio::spawn(drive(
                    connection,
                    ping_pong,
                    Driver { pool: Arc::downgrade(&self), key: key.clone(), id, closed: closed.clone(), active: active_rx },
                ));
                let conn = Arc::new(PooledConn { id, send, active, closed, tls_error });
                state.conns.push(conn.clone());
                tracing::debug!(dst = %key.0.dst(), id, "HBONE connection established");
                done.send_replace(Some(Ok(conn)));
            }
            Err(e) => {
                tracing::debug!(dst = %key.0.dst(), error = %e, "HBONE dial failed");
                if state.conns.is_empty() {
                    keys.remove(&key);
                }
                done.send_replace(Some(Err(e)));
            }
        }
    }

    /// Removes connection `id` if it carries no stream. Under the lock, so
    /// no caller can be reserving a slot on it at the same time.
    fn remove_if_idle(&self, key: &(PoolKey, u16), id: u64) -> bool {
        let mut keys = self.lock();
        let Some(state) = keys.get_mut(key) else {
            return true;
        };
        let Some(pos) = state.conns.iter().position(|c| c.id == id) else {
            return true;
        };
        if *state.conns[pos].active.borrow() != 0 {
            return false;
        }
        let conn = state.conns.remove(pos);
        conn.closed.store(true, Ordering::Release);
        if state.conns.is_empty() && state.dialing.is_none() {
            keys.remove(key);
        }
        true
    }

    fn remove(&self, key: &(PoolKey, u16), id: u64) {
        let mut keys = self.lock();
        if let Some(state) = keys.get_mut(key) {
            state.conns.retain(|c| c.id != id);
            if state.conns.is_empty() && state.dialing.is_none() {
                keys.remove(key);
            }
        }
    }
}

/// What the connection task needs to know about its pool entry. Holds the
/// pool weakly and not the `SendRequest`, so removing the entry lets the
/// connection close.
struct Driver {
    pool: Weak<PoolInner>,
    key: (PoolKey, u16),
    id: u64,
    closed: Arc<AtomicBool>,
    active: watch::Receiver<usize>,
}

/// Runs the HTTP/2 connection, its keepalive and its idle timer.
async fn drive(connection: H2Connection, ping_pong: Option<h2::PingPong>, mut driver: Driver) {
    let (interval, timeout, idle_timeout) = match driver.pool.upgrade() {
        Some(pool) => (pool.config.h2.keepalive_interval, pool.config.h2.keepalive_timeout, pool.config.idle_timeout),
        None => return,
    };
    let keepalive = async move {
        match ping_pong {
            Some(pp) => keepalive(pp, interval, timeout).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(connection, keepalive);
    let mut idle_closed = false;
    loop {
        tokio::select! {
            result = &mut connection => {
                if let Err(e) = result {
                    tracing::debug!(dst = %driver.key.0.dst(), error = %e, "HBONE connection ended");
                }
                break;
            }
            () = &mut keepalive => {
                tracing::warn!(dst = %driver.key.0.dst(), "HBONE peer stopped answering PINGs; dropping the connection");
                break;
            }
            () = wait_idle(&mut driver.active, idle_timeout), if !idle_closed => {
                // Removing the entry drops the last `SendRequest`; h2 then
                // sends GOAWAY and the connection future completes.
                idle_closed = match driver.pool.upgrade() {
                    Some(pool) => pool.remove_if_idle(&driver.key, driver.id),
                    None => true,
                };
            }
        }
    }
    driver.closed.store(true, Ordering::Release);
    if let Some(pool) = driver.pool.upgrade() {
        pool.remove(&driver.key, driver.id);
    }
}

/// Resolves once the stream count has stayed at zero for `idle`.
async fn wait_idle(active: &mut watch::Receiver<usize>, idle: Duration) {
    loop {
        // `is_ok()` drops the borrow guard before the next await.
        let alive = active.wait_for(|n| *n == 0).await.is_ok();
        if !alive {
            // The entry was removed: the connection closes on its own.
            return std::future::pending().await;
        }
        let busy_again = tokio::select! {
            () = tokio::time::sleep(idle) => return,
            r = active.wait_for(|n| *n > 0) => r.is_ok(),
        };
        if !busy_again {
            return std::future::pending().await;
        }
    }
}

async fn open_stream(
    conn: &PooledConn,
    request: &ConnectRequest,
    key: &PoolKey,
    config: &PoolConfig,
) -> Result<(h2::SendStream<Chunk>, h2::RecvStream), HboneError> {
    let addr = key.dst();
    let h2_error = |e| HboneError::from_h2(e, addr, conn.tls_error.get());
    let mut send = conn.send.clone().ready().await.map_err(h2_error)?;
    let (response, stream) = send.send_request(request.to_http(), false).map_err(h2_error)?;
    let response = tokio::time::timeout(config.response_timeout, response)
        .await
        .map_err(|_| HboneError::Timeout(TimeoutStage::Response))?
        .map_err(h2_error)?;
    if response.status() != StatusCode::OK {
        // A peer that asks this source to hold off says for how long.
        let secs = response.headers().get(http::header::RETRY_AFTER).and_then(|v| v.to_str().ok()?.trim().parse::<u32>().ok());
        return Err(match secs {
            Some(secs) if response.status() == StatusCode::SERVICE_UNAVAILABLE => {
                HboneError::RetryAfter { status: response.status(), secs }
            }
            _ => HboneError::Status(response.status()),
        });
    }
    Ok((stream, response.into_body()))
}

/// Whether a failed CONNECT means the connection must take no new streams.
fn breaks_connection(e: &HboneError) -> bool {
    match e {
        HboneError::H2(h2) => h2.is_go_away() || h2.is_io(),
        HboneError::Tls { .. } => true,
        _ => false,
    }
}
