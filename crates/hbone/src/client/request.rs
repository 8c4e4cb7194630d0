//! What a caller asks the pool for: which tunnel (the key) and what to put
//! in the CONNECT request.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Uri};
use slipstream_core::SpiffeId;

use crate::authority::format_authority;
use crate::headers::{Baggage, Forwarded, TraceParent, BAGGAGE, FORWARDED, TRACEPARENT};

/// Tunnels are shared per (source identity, expected destination
/// identities, destination address, source IP) (docs/protocols.md section 2).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    src_identity: SpiffeId,
    dst_identities: Arc<[SpiffeId]>,
    dst: SocketAddr,
    src_ip: IpAddr,
}

impl PoolKey {
    /// The expected identities are a set: their order does not make a
    /// different key.
    pub fn new(src_identity: SpiffeId, dst_identities: impl IntoIterator<Item = SpiffeId>, dst: SocketAddr, src_ip: IpAddr) -> Self {
        let mut ids: Vec<SpiffeId> = dst_identities.into_iter().collect();
        ids.sort();
        ids.dedup();
        Self { src_identity, dst_identities: ids.into(), dst, src_ip }
    }

    pub fn src_identity(&self) -> &SpiffeId {
        &self.src_identity
    }

    pub fn dst_identities(&self) -> &[SpiffeId] {
        &self.dst_identities
    }

    /// The peer proxy's HBONE address (`<pod or waypoint IP>:15008`).
    pub fn dst(&self) -> SocketAddr {
        self.dst
    }

    pub fn src_ip(&self) -> IpAddr {
        self.src_ip
    }
}

/// One CONNECT: the target and the extra headers.
#[derive(Clone, Debug)]
pub struct ConnectRequest {
    authority: SocketAddr,
    headers: HeaderMap,
}

impl ConnectRequest {
    /// `authority` is the target as docs/protocols.md defines it: the pod IP and
    /// target port, or towards a waypoint the original destination.
    pub fn new(authority: SocketAddr) -> Self {
        Self { authority, headers: HeaderMap::new() }
    }

    pub fn authority(&self) -> SocketAddr {
        self.authority
    }

    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// Adds `baggage` unless every value is empty.
    pub fn with_baggage(self, baggage: &Baggage) -> Self {
        match baggage.header_value() {
            Some(v) => self.with_header(HeaderName::from_static(BAGGAGE), v),
            None => self,
        }
    }

    /// Adds `forwarded` (left out if the host name cannot be encoded).
    pub fn with_forwarded(self, forwarded: &Forwarded) -> Self {
        match forwarded.header_value() {
            Some(v) => self.with_header(HeaderName::from_static(FORWARDED), v),
            None => self,
        }
    }

    pub fn with_traceparent(self, trace: TraceParent) -> Self {
        self.with_header(HeaderName::from_static(TRACEPARENT), trace.header_value())
    }

    /// A new random `traceparent`: what a connection should carry.
    pub fn with_fresh_traceparent(self) -> Self {
        self.with_traceparent(TraceParent::random())
    }

    /// The h2 request: method CONNECT and a URI that is only the authority,
    /// so h2 sends exactly `:method` and `:authority` (no `:scheme`/`:path`).
    pub(crate) fn to_http(&self) -> Request<()> {
        let uri = Uri::try_from(format_authority(self.authority)).expect("ip:port is a valid authority");
        let mut request = Request::new(());
        *request.method_mut() = Method::CONNECT;
        *request.uri_mut() = uri;
        *request.headers_mut() = self.headers.clone();
        request
    }
}
