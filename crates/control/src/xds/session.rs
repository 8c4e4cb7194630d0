//! One proxy's delta xDS stream as a state machine without I/O: requests
//! and publications in, responses out. The stream task (`super::stream`)
//! only moves messages; every decision about what to send is here, and
//! the unit tests below drive it message by message.
//!
//! What the session keeps, per stream:
//! - `held`: what the proxy holds as far as the server knows (what it
//!   declared in `initial_resource_versions` and we agreed with, then
//!   everything sent and not removed since). It is a persistent map whose
//!   values are the store's own: when the proxy subscribes to every type
//!   by wildcard and nothing is pending, it *is* the published map (one
//!   pointer), so a thousand streams in sync cost one map, not a thousand.
//! - per type: the subscription, what is due (the first response, a full
//!   comparison, or the names changed since the last response: a set, so
//!   changes that arrive while the proxy is slow coalesce), the versions
//!   the proxy refused, the responses not answered yet (bounded), and the
//!   counters humans read.

use super::wire::Outgoing;
use crate::resources::{ResourceKey, Resources};
use crate::store::Published;
use slipstream_api::discovery::DeltaDiscoveryRequest;
use slipstream_api::TypeUrl;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// Responses awaiting an answer, per type; older ones are forgotten (an
/// answer to one of them is then only logged).
const MAX_UNANSWERED: usize = 16;
/// Unknown type URLs remembered (each is logged once).
const MAX_UNKNOWN_TYPES: usize = 16;
/// A NACK's reason is kept up to this many bytes.
const MAX_REASON: usize = 1024;

/// One response the proxy has not answered yet.
#[derive(Debug)]
struct Sent {
    nonce: String,
    generation: u64,
    /// Name and version of each resource it carried: refused together if
    /// the proxy NACKs it.
    items: Vec<(Arc<str>, Arc<str>)>,
}

/// The proxy's last refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nack {
    pub nonce: String,
    /// Generation of the refused response.
    pub generation: u64,
    pub reason: String,
}

#[derive(Debug, Default)]
struct TypeState {
    /// The proxy sent a first request for this type.
    subscribed: bool,
    wildcard: bool,
    /// Explicitly subscribed names (besides the wildcard).
    names: BTreeSet<Arc<str>>,
    /// The first response since subscribing is still to be sent (it is
    /// sent even if empty: the proxy then knows it has the full set).
    first_due: bool,
    /// Compare everything held with everything published.
    full_due: bool,
    /// Names to look at again.
    dirty: BTreeSet<Arc<str>>,
    /// Names the proxy claims or asked for by name: if they do not exist,
    /// it is told so (in `removed_resources`) even though it was never
    /// sent them.
    absent: BTreeSet<Arc<str>>,
    /// Versions the proxy refused: not sent again until they change.
    refused: HashMap<Arc<str>, Arc<str>>,
    unanswered: VecDeque<Sent>,
    /// How many resources of this type `held` has.
    held: usize,
    sent_nonce: String,
    sent_generation: u64,
    acked_nonce: String,
    /// Every response up to this generation was answered.
    answered_through: u64,
    nacks: u64,
    last_nack: Option<Nack>,
    /// The last answer was a NACK.
    nack_open: bool,
}

impl TypeState {
    fn covers(&self, name: &str) -> bool {
        self.subscribed && (self.wildcard || self.names.contains(name))
    }

    fn due(&self) -> bool {
        self.first_due || self.full_due || !self.dirty.is_empty() || !self.absent.is_empty()
    }
}

/// What one type of a stream looks like to humans and to the ACK waiter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeProgress {
    pub type_url: TypeUrl,
    pub sent_nonce: String,
    pub sent_generation: u64,
    pub acked_nonce: String,
    pub answered_through: u64,
    pub resources: usize,
    pub nacks: u64,
    pub last_nack: Option<Nack>,
    pub nack_open: bool,
    /// Everything sent was acknowledged.
    pub in_sync: bool,
}

fn idx(t: TypeUrl) -> usize {
    match t {
        TypeUrl::Address => 0,
        TypeUrl::Authorization => 1,
        TypeUrl::NetworkPolicy => 2,
        TypeUrl::Route => 3,
        TypeUrl::Mesh => 4,
    }
}

pub struct Session {
    /// For logs: the proxy's node name.
    proxy: Arc<str>,
    current: Arc<Published>,
    held: Resources,
    types: [TypeState; 5],
    next_nonce: u64,
    unknown_types: BTreeSet<String>,
}

impl Session {
    pub fn new(proxy: &str, current: Arc<Published>) -> Session {
        Session {
            proxy: proxy.into(),
            current,
            held: Resources::new(),
            types: Default::default(),
            next_nonce: 0,
            unknown_types: BTreeSet::new(),
        }
    }

    /// The generation this session has caught up with.
    pub fn generation(&self) -> u64 {
        self.current.generation
    }

    /// A request from the proxy: an answer to a response (ACK or NACK),
    /// a first subscription, or a change of subscription. Returns what to
    /// send now.
    pub fn on_request(&mut self, req: DeltaDiscoveryRequest) -> Vec<Outgoing> {
        let Some(t) = TypeUrl::parse(&req.type_url) else {
            if self.unknown_types.len() < MAX_UNKNOWN_TYPES && self.unknown_types.insert(req.type_url.clone()) {
                tracing::warn!(proxy = %self.proxy, type_url = %req.type_url, "request for a type this control plane does not serve: not answered");
            }
            return Vec::new();
        };
        if !req.response_nonce.is_empty() {
            self.answer(t, &req.response_nonce, req.error_detail.as_ref().map(|s| s.message.as_str()));
        } else if let Some(e) = &req.error_detail {
            tracing::warn!(proxy = %self.proxy, r#type = %t, reason = %e.message, "NACK without a nonce: ignored");
        }
        if !self.types[idx(t)].subscribed {
            // The first request of a type: an empty subscribe list is the
            // wildcard (as are "*" entries); ztunnel's "subscribe to
            // nothing" is subscribe ["*"] with unsubscribe ["*"].
            // Keys of this type the session held only because it shared
            // the published map (see `flush`) were never sent: forget them.
            let stale: Vec<ResourceKey> = self.held.keys().filter(|k| k.type_url == t).cloned().collect();
            for k in stale {
                self.held.remove(&k);
            }
            let ts = &mut self.types[idx(t)];
            ts.held = 0;
            ts.subscribed = true;
            ts.first_due = true;
            ts.full_due = true;
            ts.wildcard = req.resource_names_subscribe.is_empty();
            self.subscribe(t, &req.resource_names_subscribe);
            self.unsubscribe(t, &req.resource_names_unsubscribe);
            self.claim(t, &req.initial_resource_versions);
        } else {
            if !req.initial_resource_versions.is_empty() {
                tracing::debug!(proxy = %self.proxy, r#type = %t, "initial_resource_versions after the first request: ignored");
            }
            self.subscribe(t, &req.resource_names_subscribe);
            self.unsubscribe(t, &req.resource_names_unsubscribe);
        }
        self.flush()
    }

    /// A newer publication: what changed since the last one this session
    /// handled is due (or everything, if the log no longer reaches back).
    pub fn on_publication(&mut self, p: Arc<Published>) -> Vec<Outgoing> {
        if p.generation <= self.current.generation {
            return Vec::new();
        }
        match p.changed_since(self.current.generation) {
            Some(keys) => {
                for k in keys {
                    let ts = &mut self.types[idx(k.type_url)];
                    if ts.covers(&k.name) {
                        ts.dirty.insert(k.name.clone());
                    }
                }
            }
            None => {
                for ts in &mut self.types {
                    ts.full_due |= ts.subscribed;
                }
            }
        }
        self.current = p;
        self.flush()
    }

    /// Generation up to which the proxy answered everything, over the
    /// types it subscribed to (0 before it subscribed to any).
    pub fn answered_through(&self) -> u64 {
        self.types.iter().filter(|t| t.subscribed).map(|t| t.answered_through).min().unwrap_or(0)
    }

    /// Progress of each subscribed type.
    pub fn progress(&self) -> Vec<TypeProgress> {
        TypeUrl::ALL
            .into_iter()
            .filter(|t| self.types[idx(*t)].subscribed)
            .map(|t| {
                let ts = &self.types[idx(t)];
                TypeProgress {
                    type_url: t,
                    sent_nonce: ts.sent_nonce.clone(),
                    sent_generation: ts.sent_generation,
                    acked_nonce: ts.acked_nonce.clone(),
                    answered_through: ts.answered_through,
                    resources: ts.held,
                    nacks: ts.nacks,
                    last_nack: ts.last_nack.clone(),
                    nack_open: ts.nack_open,
                    in_sync: ts.unanswered.is_empty() && !ts.nack_open && !ts.due(),
                }
            })
            .collect()
    }

    fn subscribe(&mut self, t: TypeUrl, names: &[String]) {
        let ts = &mut self.types[idx(t)];
        for n in names {
            if n == "*" {
                if !ts.wildcard {
                    ts.wildcard = true;
                    ts.full_due = true;
                }
                continue;
            }
            let name: Arc<str> = n.as_str().into();
            if ts.names.insert(name.clone()) {
                ts.dirty.insert(name.clone());
                ts.absent.insert(name);
            }
        }
    }

    fn unsubscribe(&mut self, t: TypeUrl, names: &[String]) {
        let ts = &mut self.types[idx(t)];
        let mut forget: Vec<Arc<str>> = Vec::new();
        for n in names {
            if n == "*" {
                if ts.wildcard {
                    ts.wildcard = false;
                    // Forget what only the wildcard covered. The proxy
                    // drops those itself: no removal is sent.
                    forget.extend(
                        self.held
                            .range(ResourceKey::new(t, "")..)
                            .take_while(|(k, _)| k.type_url == t)
                            .filter(|(k, _)| !ts.names.contains(&k.name))
                            .map(|(k, _)| k.name.clone()),
                    );
                }
                continue;
            }
            if ts.names.remove(n.as_str()) && !ts.wildcard {
                forget.push(n.as_str().into());
            }
        }
        for name in forget {
            ts.dirty.remove(&name);
            ts.absent.remove(&name);
            ts.refused.remove(&name);
            if self.held.remove(&ResourceKey { type_url: t, name }).is_some() {
                ts.held -= 1;
            }
        }
    }

    /// The versions a proxy says it holds (first request of a type): those
    /// equal to ours are held; the others are sent; names we do not have
    /// are told removed.
    fn claim(&mut self, t: TypeUrl, versions: &BTreeMap<String, String>) {
        let ts = &mut self.types[idx(t)];
        for (name, version) in versions {
            if !ts.covers(name) {
                continue;
            }
            let key = ResourceKey::new(t, name);
            match self.current.resources.get(&key) {
                Some(v) if *v.version == **version => {
                    if self.held.insert(key, v.clone()).is_none() {
                        ts.held += 1;
                    }
                }
                Some(_) => {}
                None => {
                    ts.absent.insert(key.name);
                }
            }
        }
    }

    /// An ACK or NACK of the response with `nonce`.
    fn answer(&mut self, t: TypeUrl, nonce: &str, nack: Option<&str>) {
        let generation = self.current.generation;
        let proxy = self.proxy.clone();
        let ts = &mut self.types[idx(t)];
        let Some(pos) = ts.unanswered.iter().position(|s| s.nonce == nonce) else {
            match nack {
                Some(reason) => tracing::warn!(%proxy, r#type = %t, nonce, %reason, "NACK of a response this stream no longer tracks"),
                None => tracing::debug!(%proxy, r#type = %t, nonce, "ACK of a response this stream no longer tracks"),
            }
            return;
        };
        // Answers come in order: older unanswered responses are settled too.
        let sent = ts.unanswered.drain(..=pos).next_back().expect("pos is in range");
        match nack {
            None => {
                ts.acked_nonce = sent.nonce;
                ts.nack_open = false;
            }
            Some(reason) => {
                tracing::warn!(
                    %proxy,
                    r#type = %t,
                    nonce,
                    generation = sent.generation,
                    resources = sent.items.len(),
                    %reason,
                    "the proxy refused (NACK) a response; its resources are not sent again until they change"
                );
                let mut reason = reason.to_string();
                if reason.len() > MAX_REASON {
                    let mut end = MAX_REASON;
                    while !reason.is_char_boundary(end) {
                        end -= 1;
                    }
                    reason.truncate(end);
                    reason.push('…');
                }
                ts.nacks += 1;
                ts.nack_open = true;
                ts.last_nack = Some(Nack { nonce: sent.nonce, generation: sent.generation, reason });
                ts.refused.extend(sent.items);
            }
        }
        let through = if ts.unanswered.is_empty() { generation } else { sent.generation };
        ts.answered_through = ts.answered_through.max(through);
    }

    /// Builds the responses that are due, one per type at most.
    fn flush(&mut self) -> Vec<Outgoing> {
        let out: Vec<_> = TypeUrl::ALL.into_iter().filter_map(|t| self.flush_type(t)).collect();
        // In sync with everything it subscribed to by wildcard: share the
        // published map. A type the proxy never asked for (node proxies do
        // not take routes, Istio's own proxies do not know the
        // network-policy type) rides along unsent: its keys in the shared
        // map are forgotten if the proxy subscribes to it later, and it
        // counts as nothing held.
        let shared = TypeUrl::ALL.into_iter().all(|t| {
            let ts = &self.types[idx(t)];
            !ts.subscribed || (ts.wildcard && !ts.due())
        }) && self.types.iter().any(|ts| ts.subscribed);
        if shared {
            self.held = self.current.resources.clone();
            for t in TypeUrl::ALL {
                let ts = &mut self.types[idx(t)];
                ts.held = if ts.subscribed { self.current.count(t) } else { 0 };
            }
        }
        out
    }

    fn flush_type(&mut self, t: TypeUrl) -> Option<Outgoing> {
        let generation = self.current.generation;
        let ts = &mut self.types[idx(t)];
        if !ts.subscribed {
            return None;
        }
        if !ts.due() {
            if ts.unanswered.is_empty() {
                ts.answered_through = generation;
            }
            return None;
        }
        let mut names = std::mem::take(&mut ts.dirty);
        if std::mem::take(&mut ts.full_due) {
            // Compares only what the two maps do not share.
            names.extend(self.held.diff(&self.current.resources).filter_map(|d| {
                let k = match d {
                    imbl::ordmap::DiffItem::Add(k, _) | imbl::ordmap::DiffItem::Remove(k, _) => k,
                    imbl::ordmap::DiffItem::Update { new: (k, _), .. } => k,
                };
                (k.type_url == t).then(|| k.name.clone())
            }));
        }
        let absent = std::mem::take(&mut ts.absent);
        names.extend(absent.iter().cloned());

        let mut resources = Vec::new();
        let mut removed = Vec::new();
        let mut items = Vec::new();
        for name in names {
            let key = ResourceKey { type_url: t, name: name.clone() };
            let current = self.current.resources.get(&key).filter(|_| ts.covers(&name));
            match current {
                Some(v) => {
                    if self.held.get(&key).map(|h| &h.version) == Some(&v.version) {
                        continue;
                    }
                    if ts.refused.get(&name) == Some(&v.version) {
                        continue;
                    }
                    ts.refused.remove(&name);
                    resources.push((name.clone(), v.clone()));
                    items.push((name, v.version.clone()));
                    if self.held.insert(key, v.clone()).is_none() {
                        ts.held += 1;
                    }
                }
                None => {
                    ts.refused.remove(&name);
                    if self.held.remove(&key).is_some() {
                        ts.held -= 1;
                        removed.push(name.to_string());
                    } else if absent.contains(&name) && ts.covers(&name) {
                        removed.push(name.to_string());
                    }
                }
            }
        }
        if resources.is_empty() && removed.is_empty() && !ts.first_due {
            if ts.unanswered.is_empty() {
                ts.answered_through = generation;
            }
            return None;
        }
        ts.first_due = false;
        let nonce = format!("{generation}.{}", self.next_nonce);
        self.next_nonce += 1;
        ts.sent_nonce = nonce.clone();
        ts.sent_generation = generation;
        ts.unanswered.push_back(Sent { nonce: nonce.clone(), generation, items });
        if ts.unanswered.len() > MAX_UNANSWERED {
            ts.unanswered.pop_front();
        }
        Some(Outgoing { system_version_info: generation.to_string(), type_url: t, nonce, resources, removed_resources: removed })
    }
}

#[cfg(test)]
mod tests;
