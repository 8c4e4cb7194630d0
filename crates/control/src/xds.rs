//! The workload API over delta xDS (docs/protocols.md section 4):
//! `AggregatedDiscoveryService/DeltaAggregatedResources`, both type URLs on
//! one stream. See docs/control-plane.md, "Delta xDS".
//!
//! - [`XdsServer`]: the gRPC service. It authenticates the call, checks the
//!   first request's node against the caller ([`node`]), registers the
//!   stream ([`Registry`]) and runs it.
//! - [`session::Session`]: what to send when, as a state machine without
//!   I/O.
//! - the stream task (here): moves requests, publications and responses
//!   between the session and the wire. Its output channel holds one
//!   response: a proxy that reads slowly makes the task wait, and changes
//!   published meanwhile coalesce in the session instead of queueing.

pub mod grpc;
pub mod node;
pub mod registry;
pub mod session;
pub mod wire;

pub use registry::{AckReport, AckTimeout, ProxyRef, ProxyStatus, Registration, Registry, StreamInfo, TypeStatus};

use crate::auth::Authenticator;
use crate::ca::limits::{CallerLimits, Limits, LogDecision};
use crate::store::{Published, Store};
use session::Session;
use slipstream_api::discovery::DeltaDiscoveryRequest;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tonic::{Request, Response, Status, Streaming};
use wire::Outgoing;

/// Limits of the xDS service.
#[derive(Debug, Clone)]
pub struct XdsSettings {
    /// A stream whose first request does not arrive in time is closed.
    pub first_request_timeout: Duration,
    /// Largest request accepted (initial versions of a big mesh are a few MB).
    pub max_request_bytes: usize,
    /// Large responses (a first push, a full comparison) in flight at
    /// once, over every stream: each is a few MB of encoded bytes until
    /// the proxy has read it, so a hundred proxies connecting together are
    /// served a few at a time instead of all holding their copy at once.
    /// 0: no bound.
    pub large_responses_in_flight: usize,
    /// A response of at least this many encoded bytes is large.
    pub large_response_bytes: usize,
    /// A large response holds its slot until the proxy answers it, or
    /// this long: a proxy that never reads cannot keep the others waiting.
    pub large_response_hold: Duration,
}

impl Default for XdsSettings {
    fn default() -> Self {
        XdsSettings {
            first_request_timeout: Duration::from_secs(10),
            max_request_bytes: 16 << 20,
            large_responses_in_flight: 8,
            large_response_bytes: 256 << 10,
            large_response_hold: Duration::from_secs(5),
        }
    }
}

struct Inner {
    store: Store,
    auth: Arc<dyn Authenticator>,
    registry: Registry,
    settings: XdsSettings,
    /// true: every stream ends (the server is shutting down).
    closing: watch::Sender<bool>,
    /// Refusal lines in the log, per peer address: a pod that retries in
    /// a loop cannot flood it.
    refusal_logs: Limits,
    /// Slots for large responses (`XdsSettings::large_responses_in_flight`).
    large: Option<Arc<Semaphore>>,
}

/// The delta ADS service; clones share streams and registry.
#[derive(Clone)]
pub struct XdsServer {
    inner: Arc<Inner>,
}

impl XdsServer {
    pub fn new(store: Store, auth: Arc<dyn Authenticator>) -> XdsServer {
        XdsServer::with_settings(store, auth, XdsSettings::default())
    }

    pub fn with_settings(store: Store, auth: Arc<dyn Authenticator>, settings: XdsSettings) -> XdsServer {
        let (closing, _) = watch::channel(false);
        let refusal_logs = Limits::new(CallerLimits::default());
        let large = (settings.large_responses_in_flight > 0).then(|| Arc::new(Semaphore::new(settings.large_responses_in_flight)));
        XdsServer { inner: Arc::new(Inner { store, auth, registry: Registry::new(), settings, closing, refusal_logs, large }) }
    }

    /// Logs a refused stream, unless its peer has had its share of lines
    /// lately; the lines left out are counted in the next.
    fn log_refusal(&self, peer: Option<std::net::SocketAddr>, line: impl FnOnce() -> String) {
        let key = peer.map(|p| p.ip().to_string()).unwrap_or_default();
        if let LogDecision::Write { suppressed } = self.inner.refusal_logs.log_refusal(&key, std::time::Instant::now()) {
            tracing::warn!(peer = ?peer, suppressed_since_last = suppressed, "{}", line());
        }
    }

    /// The open streams (`proxy-status`, `apply`'s wait).
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Ends every stream with UNAVAILABLE, now and from now on: the proxies
    /// reconnect (to another replica) and the connections can drain.
    pub fn close_streams(&self) {
        self.inner.closing.send_replace(true);
    }

    /// The tonic service to route.
    pub fn service(&self) -> grpc::AdsService {
        grpc::AdsService::new(self.clone(), self.inner.settings.max_request_bytes)
    }

    /// One `DeltaAggregatedResources` call: authenticates it, reads and
    /// checks the first request, and starts the stream's task.
    async fn open(
        &self,
        req: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<mpsc::Receiver<Result<Outgoing, Status>>>, Status> {
        let peer = crate::peer::peer_of(&req);
        let caller = self.inner.auth.authenticate(req.metadata()).await.map_err(|e| {
            self.log_refusal(peer, || format!("xDS stream refused: {e}"));
            Status::from(e)
        })?;
        crate::peer::authenticated(&req);
        let mut inbound = req.into_inner();
        let first = match tokio::time::timeout(self.inner.settings.first_request_timeout, inbound.message()).await {
            Ok(Ok(Some(first))) => first,
            Ok(Ok(None)) => return Err(Status::invalid_argument("the stream ended before its first request")),
            Ok(Err(status)) => return Err(status),
            Err(_) => {
                return Err(Status::deadline_exceeded(format!("no first request within {:?}", self.inner.settings.first_request_timeout)))
            }
        };
        let proxy = node::check(&first, &caller).map_err(|e| {
            self.log_refusal(peer, || format!("xDS stream of {} refused: {e}", caller.subject));
            Status::from(e)
        })?;
        let registration =
            self.inner.registry.register(StreamInfo { node: proxy.node.clone(), id: proxy.id.clone(), caller: caller.subject, peer });
        tracing::info!(node = %proxy.node, id = %proxy.id, peer = ?peer, "xDS stream opened");
        let (tx, rx) = mpsc::channel(1);
        // Subscribe first, then start from what the receiver has seen: a
        // publication in between is then not missed.
        let mut publications = self.inner.store.subscribe();
        let current = publications.borrow_and_update().clone();
        let stream = Stream {
            session: Session::new(&proxy.node, current),
            publications,
            closing: self.inner.closing.subscribe(),
            inbound,
            tx,
            registration,
            large: self.inner.large.clone(),
            large_bytes: self.inner.settings.large_response_bytes,
            large_hold: self.inner.settings.large_response_hold,
            holding: None,
        };
        tokio::spawn(async move {
            let why = stream.run(first).await;
            tracing::info!(node = %proxy.node, peer = ?peer, "xDS stream closed: {why}");
        });
        Ok(Response::new(rx))
    }
}

enum Event {
    Request(Box<DeltaDiscoveryRequest>),
    Published,
    Closing,
}

/// One stream's task.
struct Stream {
    session: Session,
    publications: watch::Receiver<Arc<Published>>,
    closing: watch::Receiver<bool>,
    inbound: Streaming<DeltaDiscoveryRequest>,
    tx: mpsc::Sender<Result<Outgoing, Status>>,
    registration: Registration,
    large: Option<Arc<Semaphore>>,
    large_bytes: usize,
    large_hold: Duration,
    /// The slot of the large response in flight: released when the proxy
    /// answers that nonce, or at the deadline.
    holding: Option<Holding>,
}

struct Holding {
    _permit: OwnedSemaphorePermit,
    nonce: String,
    until: tokio::time::Instant,
}

impl Stream {
    /// Runs until the proxy goes away or the server closes; says why.
    async fn run(mut self, first: DeltaDiscoveryRequest) -> String {
        // A first request is a subscription, and its answer the proxy's
        // first push: take a slot before building it, so that a crowd of
        // proxies connecting at once waits with nothing built.
        if !self.take_slot().await {
            return self.close().await;
        }
        let mut out = self.session.on_request(first);
        loop {
            for r in out.drain(..) {
                if self.large.is_some() && prost::Message::encoded_len(&r) >= self.large_bytes {
                    if !self.take_slot().await {
                        return self.close().await;
                    }
                    if let Some(h) = &mut self.holding {
                        h.nonce = r.nonce.clone();
                    }
                } else if self.holding.as_ref().is_some_and(|h| h.nonce.is_empty()) {
                    // What was built under the first slot was small.
                    self.holding = None;
                }
                let closing = tokio::select! {
                    sent = self.tx.send(Ok(r)) => if sent.is_err() { return "the proxy went away".into() } else { false },
                    _ = self.closing.wait_for(|c| *c) => true,
                };
                if closing {
                    return self.close().await;
                }
            }
            self.registration.update(self.session.answered_through(), self.session.progress());
            let event = tokio::select! {
                msg = self.inbound.message() => match msg {
                    Ok(Some(req)) => Event::Request(Box::new(req)),
                    Ok(None) => return "the proxy ended it".into(),
                    Err(status) => return format!("{}: {}", status.code(), status.message()),
                },
                changed = self.publications.changed() => if changed.is_ok() { Event::Published } else { Event::Closing },
                _ = self.closing.wait_for(|c| *c) => Event::Closing,
                _ = self.tx.closed() => return "the proxy went away".into(),
                _ = sleep_until_some(self.holding.as_ref().map(|h| h.until)) => {
                    self.holding = None;
                    continue;
                }
            };
            out = match event {
                Event::Request(req) => {
                    if self.holding.as_ref().is_some_and(|h| h.nonce == req.response_nonce) {
                        self.holding = None;
                    }
                    self.session.on_request(*req)
                }
                Event::Published => {
                    let p = self.publications.borrow_and_update().clone();
                    self.session.on_publication(p)
                }
                Event::Closing => return self.close().await,
            };
        }
    }

    /// Holds a slot for a large response (the one already held, if any,
    /// with a new deadline). false: the server is closing.
    async fn take_slot(&mut self) -> bool {
        let Some(slots) = self.large.clone() else { return true };
        let until = tokio::time::Instant::now() + self.large_hold;
        if let Some(h) = &mut self.holding {
            h.until = until;
            return true;
        }
        let permit = tokio::select! {
            p = slots.acquire_owned() => p.expect("the semaphore is never closed"),
            _ = self.closing.wait_for(|c| *c) => return false,
        };
        self.holding = Some(Holding { _permit: permit, nonce: String::new(), until });
        true
    }

    async fn close(&mut self) -> String {
        self.holding = None;
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            self.tx.send(Err(Status::unavailable("the control plane is shutting down: reconnect"))),
        )
        .await;
        "the control plane is shutting down".into()
    }
}

/// Sleeps until `at`, or forever.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
