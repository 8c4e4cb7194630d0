//! The workload API over delta xDS (shared/PROTOCOLS.md section 4):
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

pub mod node;
pub mod registry;
pub mod session;

pub use registry::{AckReport, AckTimeout, ProxyRef, ProxyStatus, Registration, Registry, StreamInfo, TypeStatus};

use crate::auth::Authenticator;
use crate::ca::limits::{CallerLimits, Limits, LogDecision};
use crate::store::{Published, Store};
use session::Session;
use slipstream_api::discovery::aggregated_discovery_service_server::{AggregatedDiscoveryService, AggregatedDiscoveryServiceServer};
use slipstream_api::discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Limits of the xDS service.
#[derive(Debug, Clone)]
pub struct XdsSettings {
    /// A stream whose first request does not arrive in time is closed.
    pub first_request_timeout: Duration,
    /// Largest request accepted (initial versions of a big mesh are a few MB).
    pub max_request_bytes: usize,
}

impl Default for XdsSettings {
    fn default() -> Self {
        XdsSettings { first_request_timeout: Duration::from_secs(10), max_request_bytes: 16 << 20 }
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
        XdsServer { inner: Arc::new(Inner { store, auth, registry: Registry::new(), settings, closing, refusal_logs }) }
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
    pub fn service(&self) -> AggregatedDiscoveryServiceServer<XdsServer> {
        AggregatedDiscoveryServiceServer::new(self.clone()).max_decoding_message_size(self.inner.settings.max_request_bytes)
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for XdsServer {
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn delta_aggregated_resources(
        &self,
        req: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let peer = crate::serve::peer_of(&req);
        let caller = self.inner.auth.authenticate(req.metadata()).await.map_err(|e| {
            self.log_refusal(peer, || format!("xDS stream refused: {e}"));
            Status::from(e)
        })?;
        crate::serve::authenticated(&req);
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
        };
        tokio::spawn(async move {
            let why = stream.run(first).await;
            tracing::info!(node = %proxy.node, peer = ?peer, "xDS stream closed: {why}");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
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
    tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    registration: Registration,
}

impl Stream {
    /// Runs until the proxy goes away or the server closes; says why.
    async fn run(mut self, first: DeltaDiscoveryRequest) -> String {
        let mut out = self.session.on_request(first);
        loop {
            for r in out.drain(..) {
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
            };
            out = match event {
                Event::Request(req) => self.session.on_request(*req),
                Event::Published => {
                    let p = self.publications.borrow_and_update().clone();
                    self.session.on_publication(p)
                }
                Event::Closing => return self.close().await,
            };
        }
    }

    async fn close(&mut self) -> String {
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            self.tx.send(Err(Status::unavailable("the control plane is shutting down: reconnect"))),
        )
        .await;
        "the control plane is shutting down".into()
    }
}
