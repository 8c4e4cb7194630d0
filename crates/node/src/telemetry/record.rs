//! The record of one proxied connection, from open to close: the one place
//! that turns an outcome into metrics and an access-log line, so neither can
//! forget a connection or disagree with the other.
//!
//! [`ConnRecord`] is a guard. It closes when dropped, with the outcome it
//! was given ([`ConnRecord::close`], or what its [`Metered`] stream saw), the
//! reason it was cancelled for (policy change, drain deadline), or, when
//! nobody decided (the task was aborted or panicked), `Aborted`. It also
//! owns what the connection holds: its limiter slots and its place among the
//! pod's open connections, given back after the close is written.

use super::accesslog::AccessLogEntry;
use super::metrics::{Flag, Reporter, Tcp, TcpLabels};
use super::{Telemetry, REFUSAL_TARGET};
use crate::conns::{Cancelled, Registration};
use crate::error::ProxyError;
use slipstream_core::{MeshService, MeshWorkload, SpiffeId};
use slipstream_hbone::{HboneError, ResponseFlag, Upstream};
use slipstream_proxy::limits::Taken;
use slipstream_proxy::metrics::{Lv, Security};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What is known about a connection when it opens.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub reporter: Reporter,
    pub src_addr: SocketAddr,
    pub src: Option<Arc<MeshWorkload>>,
    /// The source's identity when the connection is mutual TLS: verified
    /// (inbound) or our own pod's (outbound).
    pub src_id: SrcIdentity,
    /// The address the proxy connected to (or was connected on):
    /// `<pod IP>:15008` for HBONE, as ztunnel writes `dst.addr`.
    pub dst_addr: SocketAddr,
    /// HBONE only: the tunnelled target `<pod IP>:<port>`.
    pub hbone_addr: Option<SocketAddr>,
    pub dst: Option<Arc<MeshWorkload>>,
    pub service: Option<Arc<MeshService>>,
    pub mutual_tls: bool,
}

/// The source's identity, small: in the common case it is the source
/// workload's own, which the record already points to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SrcIdentity {
    /// Plaintext: none.
    None,
    /// The identity of `ConnInfo::src`.
    OfWorkload,
    /// A verified identity that is not the identity of the workload at the
    /// source address (a waypoint, a gateway, a peer the mesh has no
    /// workload for).
    Verified(Box<SpiffeId>),
}

impl SrcIdentity {
    /// `peer` (verified) as seen from a connection whose source address is
    /// `src`'s.
    pub fn verified(peer: Option<&SpiffeId>, src: Option<&Arc<MeshWorkload>>) -> SrcIdentity {
        match (peer, src) {
            (None, _) => SrcIdentity::None,
            (Some(p), Some(w)) if w.identity() == p => SrcIdentity::OfWorkload,
            (Some(p), _) => SrcIdentity::Verified(Box::new(p.clone())),
        }
    }
}

impl ConnInfo {
    /// The source's identity, if the connection is mutual TLS.
    pub fn src_identity(&self) -> Option<&SpiffeId> {
        match &self.src_id {
            SrcIdentity::None => None,
            SrcIdentity::OfWorkload => self.src.as_deref().map(MeshWorkload::identity),
            SrcIdentity::Verified(id) => Some(id),
        }
    }

    /// The key refusal log lines are limited by: the local pod for an
    /// outbound connection (its uid), the peer's address for an inbound one.
    fn source_key(&self) -> String {
        match (self.reporter, &self.src) {
            (Reporter::Source, Some(w)) => w.uid.clone(),
            _ => self.src_addr.ip().to_canonical().to_string(),
        }
    }

    /// Whether the destination's identity is known for the labels and the
    /// log: it proved it (mutual TLS), or it is our own pod (inbound).
    fn dst_identity_known(&self) -> bool {
        self.mutual_tls || self.reporter == Reporter::Destination
    }

    fn labels(&self, flag: ResponseFlag) -> TcpLabels {
        let src = self.src.as_deref().map(MeshWorkload::labels);
        let dst = self.dst.as_deref().map(MeshWorkload::labels);
        let v = |l: Option<&slipstream_core::WorkloadLabels>, f: fn(&slipstream_core::WorkloadLabels) -> &Arc<str>| {
            l.map(|l| Lv(f(l).clone())).unwrap_or_default()
        };
        // The principal label is the identity the connection proved, which
        // need not be the identity of the workload at the source address.
        let src_principal = match (&self.src_id, &self.src) {
            (SrcIdentity::OfWorkload, Some(w)) => Lv(w.labels().principal.clone()),
            (SrcIdentity::Verified(id), _) => Lv(Arc::from(id.to_string())),
            _ => Lv::default(),
        };
        let dst_principal = if self.dst_identity_known() { v(dst, |l| &l.principal) } else { Lv::default() };
        let svc = self.service.as_deref();
        let s = |f: fn(&MeshService) -> &Arc<str>| svc.map(|s| Lv(f(s).clone())).unwrap_or_default();
        TcpLabels {
            reporter: self.reporter,
            source_workload: v(src, |l| &l.workload_name),
            source_workload_namespace: v(src, |l| &l.namespace),
            source_principal: src_principal,
            source_app: v(src, |l| &l.app),
            source_version: v(src, |l| &l.version),
            source_canonical_service: v(src, |l| &l.app),
            source_cluster: v(src, |l| &l.cluster),
            destination_service: s(MeshService::hostname),
            destination_service_namespace: s(MeshService::namespace),
            destination_service_name: s(MeshService::name),
            destination_workload: v(dst, |l| &l.workload_name),
            destination_workload_namespace: v(dst, |l| &l.namespace),
            destination_principal: dst_principal,
            destination_app: v(dst, |l| &l.app),
            destination_version: v(dst, |l| &l.version),
            destination_canonical_service: v(dst, |l| &l.app),
            destination_cluster: v(dst, |l| &l.cluster),
            request_protocol: Tcp,
            response_flags: Flag(flag),
            connection_security_policy: if self.mutual_tls { Security::MutualTls } else { Security::Unknown },
        }
    }
}

/// Lives as long as the connection. The metric labels are built from
/// `info` when the connection opens and again when it closes instead of
/// being kept (shared pointers, but a dozen of them per connection).
pub struct ConnRecord {
    info: ConnInfo,
    start: Instant,
    telemetry: Arc<Telemetry>,
    /// Client to server, and server to client.
    received: u64,
    sent: u64,
    /// Whether bytes could flow (the setup histogram has seen it).
    established: bool,
    /// None until decided; the error boxed, as it is rare and large.
    outcome: Option<Result<(), Box<ProxyError>>>,
    /// Released after the close is written (fields drop after `drop`).
    held: Option<Taken>,
    registration: Option<Registration>,
}

impl ConnRecord {
    /// Counts the connection as opened.
    pub fn open(info: ConnInfo, telemetry: Arc<Telemetry>) -> ConnRecord {
        telemetry.metrics.opened(&info.labels(ResponseFlag::None));
        ConnRecord {
            info,
            start: Instant::now(),
            telemetry,
            received: 0,
            sent: 0,
            established: false,
            outcome: None,
            held: None,
            registration: None,
        }
    }

    /// Keeps `held` (limiter slots) until the connection closes.
    pub fn holding(mut self, held: Taken) -> Self {
        self.held = Some(held);
        self
    }

    /// Keeps the connection's place among its pod's open connections (its
    /// cancellation handle) until it closes.
    pub fn registered(mut self, r: Registration) -> Self {
        self.registration = Some(r);
        self
    }

    pub fn info(&self) -> &ConnInfo {
        &self.info
    }

    /// Bytes can flow: the set-up time is observed now.
    pub fn established(&mut self) {
        if !self.established {
            self.established = true;
            self.telemetry.metrics.setup(self.info.reporter, ResponseFlag::None, self.start.elapsed().as_secs_f64());
        }
    }

    /// Closes with `result`: counted, and one access-log line.
    pub fn close(mut self, result: Result<(), ProxyError>) {
        self.outcome = Some(result.map_err(Box::new));
    }

    /// Closes after `received` bytes client to server and `sent` back.
    pub fn close_counted(mut self, received: u64, sent: u64, result: Result<(), ProxyError>) {
        (self.received, self.sent) = (received, sent);
        self.outcome = Some(result.map_err(Box::new));
    }

    /// Notes the first failure, if none was noted yet.
    fn fail(&mut self, e: ProxyError) {
        if !matches!(self.outcome, Some(Err(_))) {
            self.outcome = Some(Err(Box::new(e)));
        }
    }

    fn cancelled(&self) -> Option<Cancelled> {
        self.registration.as_ref().and_then(|r| r.cell().cancelled())
    }

    /// Whether the connection was cancelled (policy change, drain
    /// deadline); if not, the task in `cx` is woken when it is. Polled
    /// together with the connection's copy.
    pub fn poll_cancelled(&self, cx: &mut Context<'_>) -> bool {
        self.registration.as_ref().is_some_and(|r| r.cell().poll_cancelled(cx).is_some())
    }

    fn finish(&mut self) {
        let result = match (self.cancelled(), self.outcome.take()) {
            (Some(Cancelled::Revoked), _) => Err(ProxyError::Revoked("a policy change no longer allows it".into())),
            (Some(Cancelled::Drained), _) => Err(ProxyError::Drained),
            (None, Some(r)) => r.map_err(|e| *e),
            (None, None) => Err(ProxyError::Aborted),
        };
        let flag = result.as_ref().err().map_or(ResponseFlag::None, ProxyError::flag);
        let m = &self.telemetry.metrics;
        m.closed(&self.info.labels(flag), self.received, self.sent);
        if let Err(ProxyError::Denied(d)) = &result {
            m.denied(self.info.reporter, d);
        }
        if !self.established {
            m.setup(self.info.reporter, flag, self.start.elapsed().as_secs_f64());
        }
        if let Err(e) = &result {
            if e.limited_per_source() {
                let source = self.info.source_key();
                if !self.telemetry.log_refusal(&source) {
                    return;
                }
                let i = &self.info;
                tracing::warn!(target: REFUSAL_TARGET, %source, src = %i.src_addr, dst = %i.dst_addr, %flag, "connection refused: {e}");
            }
        }
        self.telemetry.log(&self.entry(result.as_ref().err()));
    }

    fn entry(&self, failure: Option<&ProxyError>) -> AccessLogEntry {
        let i = &self.info;
        let (direction, bytes_sent, bytes_recv) = match i.reporter {
            // From this proxy's point of view toward its own pod's peer.
            Reporter::Source => ("outbound", self.received, self.sent),
            Reporter::Destination => ("inbound", self.sent, self.received),
        };
        let name = |w: &Option<Arc<MeshWorkload>>| w.as_ref().map(|w| w.name.clone()).unwrap_or_default();
        let ns = |w: &Option<Arc<MeshWorkload>>| w.as_ref().map(|w| w.namespace.clone()).unwrap_or_default();
        AccessLogEntry {
            src_addr: i.src_addr.to_string(),
            src_workload: name(&i.src),
            src_namespace: ns(&i.src),
            src_identity: i.src_identity().map(ToString::to_string).unwrap_or_default(),
            dst_addr: i.dst_addr.to_string(),
            dst_hbone_addr: i.hbone_addr.map(|a| a.to_string()).unwrap_or_default(),
            dst_service: i.service.as_ref().map(|s| s.hostname.clone()).unwrap_or_default(),
            dst_workload: name(&i.dst),
            dst_namespace: ns(&i.dst),
            dst_identity: i.dst.as_ref().filter(|_| i.dst_identity_known()).map(|w| w.identity().to_string()).unwrap_or_default(),
            direction,
            bytes_sent,
            bytes_recv,
            duration: self.start.elapsed().as_millis() as u64,
            error: failure.map(ToString::to_string),
            flag: failure.map(|e| e.flag().as_str()),
        }
    }
}

impl Drop for ConnRecord {
    fn drop(&mut self) {
        if std::thread::panicking() && self.outcome.is_none() {
            self.outcome = Some(Err(Box::new(ProxyError::Aborted)));
        }
        self.finish();
    }
}

/// Which way the bytes of the app-side stream count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppSide {
    /// The app is the client (outbound): what it sends is `received`.
    Client,
    /// The app is the server (inbound): what it sends is `sent`.
    Server,
}

/// The app side of a connection: counts bytes each way into its record,
/// notes the first I/O error, and closes the record when dropped. The copy
/// that uses it says how it ended ([`Metered::finished_with`], or the HBONE
/// server through [`Upstream::finished`]); dropped without that (the task
/// was aborted) the record closes with `Aborted`.
pub struct Metered<S> {
    inner: S,
    record: ConnRecord,
    side: AppSide,
    /// Whose share of the node's buffer budget its copy draws on (the
    /// local pod's).
    budget: Option<std::sync::Arc<slipstream_proxy::limits::Source>>,
}

impl<S> Metered<S> {
    pub fn new(inner: S, mut record: ConnRecord, side: AppSide) -> Self {
        record.established();
        Metered { inner, record, side, budget: None }
    }

    /// Its copy's buffers come from `budget` (the local pod's share).
    pub fn within(mut self, budget: std::sync::Arc<slipstream_proxy::limits::Source>) -> Self {
        self.budget = Some(budget);
        self
    }

    pub fn budget(&self) -> Option<&std::sync::Arc<slipstream_proxy::limits::Source>> {
        self.budget.as_ref()
    }

    /// How the copy ended: a clean end unless an error was noted.
    pub fn finished_with(&mut self, result: Result<(), ProxyError>) {
        match result {
            Ok(()) if self.record.outcome.is_none() => self.record.outcome = Some(Ok(())),
            Ok(()) => {}
            Err(e) => self.record.fail(e),
        }
    }

    /// See [`ConnRecord::poll_cancelled`].
    pub fn poll_cancelled(&self, cx: &mut Context<'_>) -> bool {
        self.record.poll_cancelled(cx)
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The connection's cancellation handle, if it is registered.
    pub fn cancel_handle(&self) -> Option<Arc<crate::conns::CancelCell>> {
        self.record.registration.as_ref().map(Registration::handle)
    }

    fn count_from_app(&mut self, n: u64) {
        match self.side {
            AppSide::Client => self.record.received += n,
            AppSide::Server => self.record.sent += n,
        }
    }

    fn count_to_app(&mut self, n: u64) {
        match self.side {
            AppSide::Client => self.record.sent += n,
            AppSide::Server => self.record.received += n,
        }
    }

    fn note<T>(&mut self, r: &Poll<io::Result<T>>) {
        if let Poll::Ready(Err(e)) = r {
            self.record.fail(ProxyError::terminated(io::Error::new(e.kind(), e.to_string())));
        }
    }
}

/// A stream a cancelled connection ends with a reset, not a clean close:
/// the peer must not take the end of a revoked or drained connection for
/// the end of a complete answer.
pub trait Resettable {
    fn reset(&self);
}

impl Resettable for tokio::net::TcpStream {
    fn reset(&self) {
        crate::sockets::reset(self)
    }
}

#[cfg(test)]
impl Resettable for tokio::io::DuplexStream {
    fn reset(&self) {}
}

impl<S: AsyncRead + AsyncWrite + Resettable + Send + Unpin + 'static> Upstream for Metered<S> {
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.poll_cancelled(cx) {
            self.inner.reset();
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    fn finished(&mut self, result: &Result<(), HboneError>) {
        self.finished_with(result.clone().map_err(ProxyError::Hbone));
    }

    fn buffer_budget(&self) -> Option<std::sync::Arc<dyn slipstream_hbone::copy::BufferBudget>> {
        self.budget.clone().map(|b| b as std::sync::Arc<dyn slipstream_hbone::copy::BufferBudget>)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        self.count_from_app(n);
        self.note(&r);
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.count_to_app(n as u64);
        }
        self.note(&r);
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conns::Conns;
    use crate::telemetry::Sink;

    fn info() -> ConnInfo {
        ConnInfo {
            reporter: Reporter::Source,
            src_addr: "10.244.1.5:40000".parse().unwrap(),
            src: None,
            src_id: SrcIdentity::None,
            dst_addr: "192.0.2.1:443".parse().unwrap(),
            hbone_addr: None,
            dst: None,
            service: None,
            mutual_tls: false,
        }
    }

    fn telemetry() -> Arc<Telemetry> {
        Arc::new(Telemetry::with_sink(false, 5, Sink::Memory(Default::default())))
    }

    fn closed(t: &Telemetry, flag: &str) -> u64 {
        let mut l = info().labels(ResponseFlag::None);
        l.response_flags = super::super::metrics::Flag(match flag {
            "-" => ResponseFlag::None,
            "CONNECTION_TERMINATED" => ResponseFlag::ConnectionTerminated,
            "DENY" => ResponseFlag::Deny,
            _ => ResponseFlag::SelfCall,
        });
        t.metrics.tcp(&l).1
    }

    #[tokio::test]
    async fn a_task_that_panics_or_is_aborted_still_closes_its_record() {
        let t = telemetry();
        let r = ConnRecord::open(info(), t.clone());
        let panicked = tokio::spawn(async move {
            let _r = r;
            panic!("bug in a connection task");
        })
        .await;
        assert!(panicked.is_err());
        assert_eq!(closed(&t, "CONNECTION_TERMINATED"), 1, "a panic closes with Aborted");
        let r = ConnRecord::open(info(), t.clone());
        let task = tokio::spawn(async move {
            let _r = r;
            std::future::pending::<()>().await
        });
        tokio::task::yield_now().await;
        task.abort();
        let _ = task.await;
        assert_eq!(closed(&t, "CONNECTION_TERMINATED"), 2, "an aborted task closes with Aborted");
        let lines = t.lines();
        assert_eq!(lines.len(), 2);
        assert!(lines.iter().all(|l| l.contains("connection task ended without closing the connection")), "{lines:?}");
    }

    #[tokio::test]
    async fn metered_counts_and_cancellation_gives_the_reason() {
        let t = telemetry();
        let conns = Arc::new(Conns::default());
        let (mut a, b) = tokio::io::duplex(64);
        let reg = conns.register(None);
        let mut m = Metered::new(b, ConnRecord::open(info(), t.clone()).registered(reg), AppSide::Client);
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        a.write_all(b"abc").await.unwrap();
        let mut buf = [0u8; 3];
        m.read_exact(&mut buf).await.unwrap();
        m.write_all(b"de").await.unwrap();
        let waker = futures_util::task::noop_waker();
        assert!(!m.poll_cancelled(&mut Context::from_waker(&waker)));
        conns.cancel_all(Cancelled::Revoked);
        assert!(Upstream::poll_close(&mut m, &mut Context::from_waker(&waker)).is_ready(), "the copy is told to stop");
        m.finished_with(Err(ProxyError::terminated(std::io::ErrorKind::ConnectionAborted.into())));
        drop(m);
        assert_eq!(closed(&t, "DENY"), 1);
        let line = &t.lines()[0];
        assert!(line.contains("bytes_sent=3 bytes_recv=2") && line.contains("closed after a policy change"), "{line}");
        assert!(conns.is_empty(), "the registration left with the record");
    }

    #[tokio::test]
    async fn a_metered_stream_dropped_without_an_outcome_is_aborted_and_a_clean_copy_is_not() {
        let t = telemetry();
        let (_a, b) = tokio::io::duplex(64);
        drop(Metered::new(b, ConnRecord::open(info(), t.clone()), AppSide::Server));
        assert_eq!(closed(&t, "CONNECTION_TERMINATED"), 1, "nobody said how it ended");
        let (_a, b) = tokio::io::duplex(64);
        let mut m = Metered::new(b, ConnRecord::open(info(), t.clone()), AppSide::Server);
        Upstream::finished(&mut m, &Ok(()));
        drop(m);
        assert_eq!(closed(&t, "-"), 1);
    }

    #[test]
    fn per_source_refusal_lines_are_limited_but_every_one_is_counted() {
        let t = telemetry();
        for _ in 0..8 {
            let addr = "10.244.1.5:15001".parse().unwrap();
            ConnRecord::open(info(), t.clone()).close(Err(ProxyError::SelfCall(crate::selfcall::SelfCall::OwnAddress(addr))));
        }
        assert_eq!(closed(&t, "SELF_CALL"), 8);
        assert_eq!(t.lines().len(), 5, "the burst of log lines per source and second");
    }
}
