//! Every open xDS stream, for humans and for `slipstream apply`: which
//! node's proxy it is, who authenticated, from where and since when, and
//! per type what was sent and what was acknowledged or refused.
//!
//! [`Registry::proxies`] is the JSON `slipstream proxy-status` reads
//! (field names as `/debug/syncz`'s `ProxySync`); [`Registry::wait_acked`]
//! returns once every connected proxy has answered a generation, or names
//! the ones that have not when the time is up.

use super::session::TypeProgress;
use serde::{Deserialize, Serialize};
use slipstream_core::sync::LockExt;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;

/// One stream, as shown to humans.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    /// NODE_NAME of the proxy's metadata.
    pub node: String,
    /// Its xDS node id (`ztunnel~10.0.0.1~ztunnel-x.istio-system~...`).
    pub id: String,
    /// Who authenticated (`node-token:node1`).
    pub caller: String,
    pub peer: String,
    /// Seconds since the epoch when the stream opened.
    pub connected_since: u64,
    pub connected_secs: u64,
    /// The newest generation the proxy answered for every type it
    /// subscribed to (ACK, or NACK: see `lastNack`).
    pub acked_generation: u64,
    pub types: Vec<TypeStatus>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TypeStatus {
    /// `Address`, `Authorization`.
    #[serde(rename = "type")]
    pub type_name: String,
    /// Nonce and generation of the last response sent.
    pub sent_nonce: String,
    pub sent_generation: u64,
    /// Nonce of the last response acknowledged.
    pub acked_nonce: String,
    /// Every response up to this generation was answered.
    pub acked_generation: u64,
    /// Resources the proxy holds, as far as the server knows.
    pub resources: usize,
    pub nacks: u64,
    /// The reason the proxy gave for its last NACK, and the generation of
    /// the response it refused.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_nack: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub last_nack_generation: u64,
    /// Everything sent was acknowledged.
    pub in_sync: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ProxyStatus {
    pub fn in_sync(&self) -> bool {
        self.types.iter().all(|t| t.in_sync)
    }
}

impl From<&TypeProgress> for TypeStatus {
    fn from(p: &TypeProgress) -> Self {
        TypeStatus {
            type_name: p.type_url.short().to_string(),
            sent_nonce: p.sent_nonce.clone(),
            sent_generation: p.sent_generation,
            acked_nonce: p.acked_nonce.clone(),
            acked_generation: p.answered_through,
            resources: p.resources,
            nacks: p.nacks,
            last_nack: p.last_nack.as_ref().map(|n| n.reason.clone()).unwrap_or_default(),
            last_nack_generation: p.last_nack.as_ref().map(|n| n.generation).unwrap_or(0),
            in_sync: p.in_sync,
        }
    }
}

/// Who a stream is, fixed when it opens.
#[derive(Debug, Clone)]
pub struct StreamInfo {
    pub node: String,
    pub id: String,
    pub caller: String,
    pub peer: Option<SocketAddr>,
}

struct Entry {
    info: StreamInfo,
    since: SystemTime,
    opened: Instant,
    progress: Mutex<Progress>,
}

#[derive(Default, Clone)]
struct Progress {
    answered_through: u64,
    types: Vec<TypeProgress>,
}

#[derive(Default)]
struct Inner {
    streams: Mutex<BTreeMap<u64, Arc<Entry>>>,
    next: AtomicU64,
    /// Bumped on every change, for waiters.
    changed: watch::Sender<u64>,
}

/// Shared by every stream of one server; clones share it.
#[derive(Clone, Default)]
pub struct Registry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("streams", &self.inner.streams.locked().len()).finish()
    }
}

/// A stream's place in the registry; dropping it unregisters the stream.
pub struct Registration {
    id: u64,
    entry: Arc<Entry>,
    registry: Registry,
}

impl Registration {
    /// Records what the stream sent and what was answered.
    pub fn update(&self, answered_through: u64, types: Vec<TypeProgress>) {
        *self.entry.progress.locked() = Progress { answered_through, types };
        self.registry.notify();
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.inner.streams.locked().remove(&self.id);
        self.registry.notify();
    }
}

/// A proxy in an [`AckReport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyRef {
    pub node: String,
    pub peer: String,
}

impl std::fmt::Display for ProxyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (stream from {})", self.node, self.peer)
    }
}

/// Where every connected proxy stands on one generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AckReport {
    pub generation: u64,
    /// Answered with ACKs.
    pub acked: Vec<ProxyRef>,
    /// Answered, but refused part of it: with the proxy's reason.
    pub refused: Vec<(ProxyRef, String)>,
    /// Not answered yet: (proxy, the generation it has answered through).
    pub pending: Vec<(ProxyRef, u64)>,
}

/// [`Registry::wait_acked`] ran out of time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} of {} connected proxies did not acknowledge generation {} within {:?}: {}", .report.pending.len(), .report.pending.len() + .report.acked.len() + .report.refused.len(), .report.generation, .waited, pending_list(&.report.pending))]
pub struct AckTimeout {
    pub waited: Duration,
    pub report: AckReport,
}

fn pending_list(p: &[(ProxyRef, u64)]) -> String {
    p.iter().map(|(r, g)| format!("{r}, at generation {g}")).collect::<Vec<_>>().join("; ")
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    pub fn register(&self, info: StreamInfo) -> Registration {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(Entry { info, since: SystemTime::now(), opened: Instant::now(), progress: Mutex::new(Progress::default()) });
        self.inner.streams.locked().insert(id, entry.clone());
        self.notify();
        Registration { id, entry, registry: self.clone() }
    }

    fn notify(&self) {
        self.inner.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn entries(&self) -> Vec<Arc<Entry>> {
        self.inner.streams.locked().values().cloned().collect()
    }

    /// Open streams.
    pub fn len(&self) -> usize {
        self.inner.streams.locked().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every open stream, oldest first.
    pub fn proxies(&self) -> Vec<ProxyStatus> {
        self.entries()
            .iter()
            .map(|e| {
                let p = e.progress.locked().clone();
                ProxyStatus {
                    node: e.info.node.clone(),
                    id: e.info.id.clone(),
                    caller: e.info.caller.clone(),
                    peer: e.info.peer.map(|a| a.to_string()).unwrap_or_default(),
                    connected_since: secs(e.since),
                    connected_secs: e.opened.elapsed().as_secs(),
                    acked_generation: p.answered_through,
                    types: p.types.iter().map(TypeStatus::from).collect(),
                }
            })
            .collect()
    }

    /// Where every connected proxy stands on `generation`.
    pub fn report(&self, generation: u64) -> AckReport {
        let mut r = AckReport { generation, ..Default::default() };
        for e in self.entries() {
            let p = e.progress.locked().clone();
            let who = ProxyRef { node: e.info.node.clone(), peer: e.info.peer.map(|a| a.to_string()).unwrap_or_else(|| "?".into()) };
            if p.answered_through < generation || p.types.is_empty() {
                r.pending.push((who, p.answered_through));
                continue;
            }
            let refusal = p
                .types
                .iter()
                .filter(|t| t.nack_open)
                .filter_map(|t| {
                    t.last_nack.as_ref().filter(|n| n.generation >= generation).map(|n| format!("{}: {}", t.type_url, n.reason))
                })
                .collect::<Vec<_>>();
            if refusal.is_empty() {
                r.acked.push(who);
            } else {
                r.refused.push((who, refusal.join("; ")));
            }
        }
        r
    }

    /// Waits until every connected proxy has answered `generation` (a
    /// proxy that disconnects stops counting; one that connects meanwhile
    /// counts once it has answered its first responses). Ok even if some
    /// refused it (see [`AckReport::refused`]); Err naming the proxies that
    /// have not answered when `timeout` is up.
    pub async fn wait_acked(&self, generation: u64, timeout: Duration) -> Result<AckReport, AckTimeout> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changed = self.inner.changed.subscribe();
        loop {
            changed.borrow_and_update();
            let report = self.report(generation);
            if report.pending.is_empty() {
                return Ok(report);
            }
            tokio::select! {
                _ = changed.changed() => {}
                _ = tokio::time::sleep_until(deadline) => {
                    let report = self.report(generation);
                    return if report.pending.is_empty() { Ok(report) } else { Err(AckTimeout { waited: timeout, report }) };
                }
            }
        }
    }
}
