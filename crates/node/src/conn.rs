//! The record of one proxied connection, from open to close. The one place
//! that turns an outcome into metrics and an access-log line, so neither can
//! forget a connection or disagree with the other.

use crate::accesslog::AccessLogEntry;
use crate::limits::{LogDecision, RefusalLog, Taken};
use crate::metrics::{Metrics, Peer, Reporter, ResponseFlag, TcpLabels};
use slipstream_core::{Service, Workload};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The target of refusal lines and their summaries: limited per source
/// here, so the per-call-site log limiter lets them through.
pub const REFUSAL_TARGET: &str = slipstream_core::PER_SOURCE_LOG_TARGET;

pub struct Telemetry {
    pub metrics: Metrics,
    pub json_log: bool,
    /// Refusals (self-calls, limits) log a few lines per source and
    /// second; the metrics count every one.
    pub refusal_log: RefusalLog<String>,
}

impl Telemetry {
    pub fn new(json_log: bool, refusal_log_burst: u32) -> Telemetry {
        Telemetry { metrics: Metrics::default(), json_log, refusal_log: RefusalLog::new(refusal_log_burst, Duration::from_secs(1)) }
    }

    pub fn log(&self, e: &AccessLogEntry) {
        println!("{}", e.render(self.json_log));
    }

    /// Whether a refusal from `source` gets its log lines now.
    pub fn log_refusal(&self, source: &str) -> bool {
        self.refusal_log.check(source, Instant::now()) == LogDecision::Log
    }

    /// One WARN line per source whose refusal lines were suppressed in
    /// the last second, saying how many; call it every second.
    pub fn summarise_refusals(&self) {
        for (source, n) in self.refusal_log.summaries(Instant::now()) {
            tracing::warn!(target: REFUSAL_TARGET, %source, suppressed = n, "{n} more refusals of this source not logged (log lines are limited per source; the metrics count every one)");
        }
    }
}

/// What is known about a connection when it opens.
pub struct ConnInfo {
    pub reporter: Reporter,
    pub src_addr: SocketAddr,
    pub src: Option<Arc<Workload>>,
    /// Verified (inbound) or our own (outbound) identity; empty if none.
    pub src_identity: String,
    pub dst_addr: SocketAddr,
    pub hbone_addr: Option<SocketAddr>,
    pub dst: Option<Arc<Workload>>,
    pub dst_identity: String,
    pub service: Option<Arc<Service>>,
    pub mutual_tls: bool,
}

/// Lives as long as the connection. The metric labels (a dozen strings) are
/// built from `info` when the connection opens and again when it closes
/// instead of being kept: with 10k open connections that is 10 MB less.
pub struct ConnRecord {
    info: ConnInfo,
    start: Instant,
    telemetry: Arc<Telemetry>,
    /// The limiter slots the connection holds, released with the record.
    held: Option<Taken>,
}

fn peer(w: &Option<Arc<Workload>>, identity: &str) -> Peer {
    match w {
        Some(w) => Peer {
            workload: w.workload_name.clone(),
            namespace: w.namespace.clone(),
            principal: identity.to_string(),
            app: w.canonical_name.clone(),
            version: w.canonical_revision.clone(),
            cluster: w.cluster_id.clone(),
        },
        None => Peer { principal: identity.to_string(), ..Default::default() },
    }
}

fn labels(info: &ConnInfo, response_flags: ResponseFlag) -> TcpLabels {
    TcpLabels {
        reporter: info.reporter,
        source: peer(&info.src, &info.src_identity),
        destination: peer(&info.dst, &info.dst_identity),
        destination_service: info.service.as_ref().map(|s| s.hostname.clone()).unwrap_or_default(),
        destination_service_name: info.service.as_ref().map(|s| s.name.clone()).unwrap_or_default(),
        destination_service_namespace: info.service.as_ref().map(|s| s.namespace.clone()).unwrap_or_default(),
        response_flags,
        mutual_tls: info.mutual_tls,
    }
}

impl ConnRecord {
    /// Counts the connection as opened.
    pub fn open(info: ConnInfo, telemetry: Arc<Telemetry>) -> ConnRecord {
        telemetry.metrics.opened(&labels(&info, ResponseFlag::None));
        ConnRecord { info, start: Instant::now(), telemetry, held: None }
    }

    /// Keeps `held` (limiter slots) until the connection closes.
    pub fn holding(mut self, held: Taken) -> Self {
        self.held = Some(held);
        self
    }

    /// A connection refused before it carried a byte (a self-call, a
    /// source over its limits): counted with `flag` like any close, but its
    /// access-log line and a WARN line are written only while `source` has
    /// log lines left this second (see [`Telemetry::summarise_refusals`]).
    pub fn refuse(self, flag: ResponseFlag, detail: String, source: &str) {
        if self.telemetry.log_refusal(source) {
            let i = &self.info;
            tracing::warn!(target: REFUSAL_TARGET, %source, src = %i.src_addr, dst = %i.dst_addr, %flag, "connection refused: {detail}");
            self.close(0, 0, Some((flag, detail)));
        } else {
            self.telemetry.metrics.closed(&labels(&self.info, flag), 0, 0);
        }
    }

    /// Counts the close and writes the access-log line. `received` is client
    /// to server, `sent` server to client.
    pub fn close(self, received: u64, sent: u64, failure: Option<(ResponseFlag, String)>) {
        // Opened with "-", closed with the flag: the close carries it.
        let flag = failure.as_ref().map_or(ResponseFlag::None, |(f, _)| *f);
        self.telemetry.metrics.closed(&labels(&self.info, flag), received, sent);
        let i = &self.info;
        let (direction, bytes_sent, bytes_recv) = match i.reporter {
            // From this proxy's point of view toward its own pod's peer.
            Reporter::Source => ("outbound", received, sent),
            Reporter::Destination => ("inbound", sent, received),
        };
        self.telemetry.log(&AccessLogEntry {
            src_addr: i.src_addr.to_string(),
            src_workload: i.src.as_ref().map(|w| w.name.clone()).unwrap_or_default(),
            src_namespace: i.src.as_ref().map(|w| w.namespace.clone()).unwrap_or_default(),
            src_identity: i.src_identity.clone(),
            dst_addr: i.dst_addr.to_string(),
            dst_hbone_addr: i.hbone_addr.map(|a| a.to_string()).unwrap_or_default(),
            dst_service: i.service.as_ref().map(|s| s.hostname.clone()).unwrap_or_default(),
            dst_workload: i.dst.as_ref().map(|w| w.name.clone()).unwrap_or_default(),
            dst_namespace: i.dst.as_ref().map(|w| w.namespace.clone()).unwrap_or_default(),
            dst_identity: i.dst_identity.clone(),
            direction,
            bytes_sent,
            bytes_recv,
            duration: self.start.elapsed().as_millis() as u64,
            error: failure.as_ref().map(|(_, e)| e.clone()),
            flag: failure.as_ref().map(|(f, _)| f.as_str()),
        });
    }
}
