//! Istio's request metrics, as a waypoint reports them (shared/
//! docs/protocols.md section 6; Istio's `reporter="waypoint"`):
//! `istio_requests_total`, `istio_request_duration_milliseconds`,
//! `istio_request_bytes` and `istio_response_bytes`, with Istio's labels.
//! One observation per request, when its answer has been sent whole (or
//! the client went away): bodies are counted as they pass
//! ([`Counted`]), not taken from `content-length`.
//!
//! Label values come from the mesh's workloads and services and from a
//! fixed set of flags, and `response_code` is a number below 600: the
//! series are bounded by the mesh, not by what clients send.

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use slipstream_core::sync::LockExt;
use slipstream_core::{MeshService, MeshWorkload};
use slipstream_proxy::metrics::{Lv, Security};
use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// `reporter`: always `waypoint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Waypoint;

impl EncodeLabelValue for Waypoint {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str("waypoint")
    }
}

/// `request_protocol`: `http` or `grpc` (by the request's content type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    Http,
    Grpc,
}

impl EncodeLabelValue for Protocol {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        e.write_str(match self {
            Protocol::Http => "http",
            Protocol::Grpc => "grpc",
        })
    }
}

/// `response_code` (and `grpc_response_status`): a number, or `0` /
/// empty when there was none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Code(pub u16);

impl EncodeLabelValue for Code {
    fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        write!(e, "{}", self.0)
    }
}

/// Istio's labels of the HTTP metrics, in Istio's order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RequestLabels {
    pub reporter: Waypoint,
    pub source_workload: Lv,
    pub source_workload_namespace: Lv,
    pub source_principal: Lv,
    pub source_app: Lv,
    pub source_version: Lv,
    pub source_canonical_service: Lv,
    pub source_cluster: Lv,
    pub destination_service: Lv,
    pub destination_service_namespace: Lv,
    pub destination_service_name: Lv,
    pub destination_workload: Lv,
    pub destination_workload_namespace: Lv,
    pub destination_principal: Lv,
    pub destination_app: Lv,
    pub destination_version: Lv,
    pub destination_canonical_service: Lv,
    pub destination_cluster: Lv,
    pub request_protocol: Protocol,
    pub response_code: Code,
    pub grpc_response_status: Lv,
    /// Envoy's flag, from a fixed set (`-`, `NR`, `UH`, `UF`, `UT`, ...).
    pub response_flags: Lv,
    pub connection_security_policy: Security,
}

impl RequestLabels {
    /// The labels of a request from `src` (the verified caller; its
    /// workload when the mesh knows it) to `service` or `dst`.
    pub fn new(
        src: Option<&MeshWorkload>,
        src_principal: &Arc<str>,
        service: Option<&MeshService>,
        dst: Option<&MeshWorkload>,
        protocol: Protocol,
        code: u16,
        flag: &str,
    ) -> RequestLabels {
        let v = |w: Option<&MeshWorkload>, f: fn(&slipstream_core::WorkloadLabels) -> &Arc<str>| {
            w.map(|w| Lv(f(w.labels()).clone())).unwrap_or_default()
        };
        // Shared with the mesh's own copies: labelling a request copies
        // pointers, not strings.
        let s = |f: fn(&MeshService) -> &Arc<str>| service.map(|s| Lv(f(s).clone())).unwrap_or_default();
        RequestLabels {
            reporter: Waypoint,
            source_workload: v(src, |l| &l.workload_name),
            source_workload_namespace: v(src, |l| &l.namespace),
            source_principal: Lv(src_principal.clone()),
            source_app: v(src, |l| &l.app),
            source_version: v(src, |l| &l.version),
            source_canonical_service: v(src, |l| &l.app),
            source_cluster: v(src, |l| &l.cluster),
            destination_service: s(|x| x.hostname()),
            destination_service_namespace: s(|x| x.namespace()),
            destination_service_name: s(|x| x.name()),
            destination_workload: v(dst, |l| &l.workload_name),
            destination_workload_namespace: v(dst, |l| &l.namespace),
            destination_principal: v(dst, |l| &l.principal),
            destination_app: v(dst, |l| &l.app),
            destination_version: v(dst, |l| &l.version),
            destination_canonical_service: v(dst, |l| &l.app),
            destination_cluster: v(dst, |l| &l.cluster),
            request_protocol: protocol,
            response_code: Code(code),
            grpc_response_status: Lv::default(),
            response_flags: flag_label(flag),
            connection_security_policy: Security::MutualTls,
        }
    }
}

/// The label of a response flag. The flags are a few fixed words: each
/// is made into a label once per thread, not once per request.
fn flag_label(flag: &str) -> Lv {
    thread_local! {
        static SEEN: std::cell::RefCell<Vec<Lv>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SEEN.with(|seen| {
        let mut seen = seen.borrow_mut();
        if let Some(l) = seen.iter().find(|l| &*l.0 == flag) {
            return l.clone();
        }
        let l = Lv::from(flag);
        // Bounded: flags come from the code, but never let it grow.
        if seen.len() < 64 {
            seen.push(l.clone());
        }
        l
    })
}

/// Istio's buckets for `istio_request_duration_milliseconds`.
const DURATION_BUCKETS: [f64; 19] = [
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0, 60000.0, 300000.0, 600000.0, 1800000.0,
    3600000.0,
];
/// Istio's buckets for the byte sizes: 1 to 10^8, by tens.
const BYTES_BUCKETS: [f64; 9] = [1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0, 1000000.0, 10000000.0, 100000000.0];

/// The waypoint's metrics, registered once.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    duration: Family<RequestLabels, Histogram>,
    request_bytes: Family<RequestLabels, Histogram>,
    response_bytes: Family<RequestLabels, Histogram>,
    /// The four series of each label set, found with one lookup (instead
    /// of one per family: 23 labels hashed each time).
    series: std::sync::Mutex<std::collections::HashMap<RequestLabels, Series>>,
}

/// One label set's series of the four families (clones share the values).
struct Series {
    requests: Counter,
    duration: Histogram,
    request_bytes: Histogram,
    response_bytes: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = Family::default();
        let duration = Family::<RequestLabels, Histogram>::new_with_constructor(|| Histogram::new(DURATION_BUCKETS));
        let request_bytes = Family::<RequestLabels, Histogram>::new_with_constructor(|| Histogram::new(BYTES_BUCKETS));
        let response_bytes = Family::<RequestLabels, Histogram>::new_with_constructor(|| Histogram::new(BYTES_BUCKETS));
        // prometheus-client adds `_total` to counters.
        registry.register("istio_requests", "Requests through the waypoint", requests.clone());
        registry.register("istio_request_duration_milliseconds", "Time from the request to the end of its answer", duration.clone());
        registry.register("istio_request_bytes", "Request body sizes", request_bytes.clone());
        registry.register("istio_response_bytes", "Response body sizes", response_bytes.clone());
        Metrics { registry, requests, duration, request_bytes, response_bytes, series: Default::default() }
    }
}

impl Metrics {
    pub fn observe(&self, l: &RequestLabels, millis: f64, request_bytes: u64, response_bytes: u64) {
        let mut all = self.series.locked();
        let series = match all.get(l) {
            Some(s) => s,
            None => {
                let s = Series {
                    requests: self.requests.get_or_create(l).clone(),
                    duration: self.duration.get_or_create(l).clone(),
                    request_bytes: self.request_bytes.get_or_create(l).clone(),
                    response_bytes: self.response_bytes.get_or_create(l).clone(),
                };
                all.entry(l.clone()).or_insert(s)
            }
        };
        series.requests.inc();
        series.duration.observe(millis);
        series.request_bytes.observe(request_bytes as f64);
        series.response_bytes.observe(response_bytes as f64);
    }

    /// Requests counted with these labels (tests).
    pub fn requests(&self, l: &RequestLabels) -> u64 {
        self.requests.get_or_create(l).get()
    }

    /// The OpenMetrics text of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// `grpc-status` (a trailer, or a header of a trailers-only answer) as a
/// label value: only gRPC's codes (0-16) are taken, so a server cannot
/// make series of its choosing.
pub fn grpc_status(h: &http::HeaderMap) -> Option<Lv> {
    let v = h.get("grpc-status")?.to_str().ok()?;
    v.parse::<u8>().ok().filter(|c| *c <= 16).map(|_| Lv::from(v))
}

/// Bytes of a body, counted as its frames pass.
#[derive(Debug, Default, Clone)]
pub struct Tally(Arc<AtomicU64>);

impl Tally {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
}

/// What to observe when a response body ends (or is dropped unfinished).
pub struct Pending {
    pub metrics: Arc<Metrics>,
    pub labels: RequestLabels,
    pub start: Instant,
    pub request: Tally,
}

/// A body whose data bytes are counted into `tally`; a response body
/// carries the request's [`Pending`] observation, made once when it ends
/// or is dropped.
pub struct Counted<B> {
    inner: B,
    tally: Tally,
    pending: Option<Pending>,
}

impl<B> Counted<B> {
    pub fn new(inner: B, tally: Tally, pending: Option<Pending>) -> Self {
        Counted { inner, tally, pending }
    }

    fn finish(&mut self) {
        if let Some(p) = self.pending.take() {
            p.metrics.observe(&p.labels, p.start.elapsed().as_secs_f64() * 1000.0, p.request.get(), self.tally.get());
        }
    }
}

impl<B> Drop for Counted<B> {
    fn drop(&mut self) {
        self.finish();
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    self.tally.add(d.len() as u64);
                }
                if let (Some(t), Some(p)) = (f.trailers_ref(), self.pending.as_mut()) {
                    if let Some(code) = grpc_status(t) {
                        p.labels.grpc_response_status = code;
                    }
                }
            }
            Poll::Ready(None) => self.finish(),
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    #[tokio::test]
    async fn a_response_is_observed_once_with_both_sizes() {
        let m = Arc::new(Metrics::default());
        let l = RequestLabels::new(None, &Arc::from("spiffe://cluster.local/ns/a/sa/b"), None, None, Protocol::Http, 200, "-");
        let request = Tally::default();
        request.add(7);
        let body = Counted::new(
            Full::new(Bytes::from_static(b"hello world")),
            Tally::default(),
            Some(Pending { metrics: m.clone(), labels: l.clone(), start: Instant::now(), request }),
        );
        let got = body.collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], b"hello world");
        assert_eq!(m.requests(&l), 1, "observed at the end, and not again on drop");
        let text = m.render();
        let line = text.lines().find(|l| l.starts_with("istio_requests_total{")).unwrap();
        assert!(line.starts_with("istio_requests_total{reporter=\"waypoint\",source_workload=\"unknown\""), "{line}");
        assert!(line.contains("source_principal=\"spiffe://cluster.local/ns/a/sa/b\""), "{line}");
        assert!(line.contains("request_protocol=\"http\",response_code=\"200\""), "{line}");
        assert!(line.contains("response_flags=\"-\",connection_security_policy=\"mutual_tls\""), "{line}");
        assert!(
            text.contains("istio_response_bytes_sum{")
                && text.lines().any(|x| x.starts_with("istio_response_bytes_sum{") && x.ends_with(" 11.0")),
            "{text}"
        );
        assert!(text.lines().any(|x| x.starts_with("istio_request_bytes_sum{") && x.ends_with(" 7.0")), "{text}");
    }

    #[tokio::test]
    async fn a_body_dropped_unfinished_is_still_observed() {
        let m = Arc::new(Metrics::default());
        let l = RequestLabels::new(None, &Arc::from("x"), None, None, Protocol::Grpc, 503, "UF");
        let body = Counted::new(
            Full::new(Bytes::from_static(b"abc")),
            Tally::default(),
            Some(Pending { metrics: m.clone(), labels: l.clone(), start: Instant::now(), request: Tally::default() }),
        );
        drop(body);
        assert_eq!(m.requests(&l), 1);
    }
}
