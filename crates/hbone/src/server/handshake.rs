//! Why an inbound connection never carried a CONNECT: classified once,
//! here, so the proxy can count it by a fixed reason and log words an
//! operator can act on ("plaintext HTTP", "client certificate from an
//! untrusted CA") instead of a rustls error kind.

use std::fmt;
use std::io;
use std::net::SocketAddr;

use rustls::CertificateError;
use slipstream_identity::tls::UntrustedPeer;

/// How many leading bytes of a connection are kept to tell TLS from
/// anything else.
pub(crate) const PEEK_LEN: usize = 16;

/// The first byte of a TLS handshake record (content type 22).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The fixed set of reasons (a metric label: never add a free-form value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HandshakeFailureKind {
    /// The peer sent something that is not a TLS handshake (plaintext HTTP,
    /// garbage).
    NotTls,
    /// The peer closed or reset the connection before the handshake ended.
    Closed,
    /// The handshake did not finish within the server's budget.
    Timeout,
    /// The client certificate does not chain to our roots.
    UntrustedCa,
    /// The client certificate chains to our roots but names no identity in
    /// our trust domain.
    TrustDomain,
    /// The client presented no certificate.
    NoClientCertificate,
    /// The client certificate is unusable otherwise (expired, wrong usage).
    BadCertificate,
    /// The peer aborted with an alert: typically it rejected our
    /// certificate (not the identity it expected).
    PeerRejected,
    /// Any other TLS failure (version, suites, ALPN...).
    Tls,
    /// TLS succeeded but the peer does not speak HTTP/2.
    Http2,
    /// Refused: no local workload owns the destination address.
    NoWorkload,
    /// Refused: the destination workload's certificate is unavailable.
    CertUnavailable,
    /// Refused before the handshake: the peer address already holds as
    /// many open connections as it may.
    PeerConnectionLimit,
    /// Refused before the handshake: the peer address already has as many
    /// handshakes in progress as it may.
    PeerHandshakeLimit,
    /// Refused before the handshake: the proxy's connection budget is spent.
    Overload,
}

impl HandshakeFailureKind {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotTls => "not_tls",
            Self::Closed => "closed",
            Self::Timeout => "timeout",
            Self::UntrustedCa => "untrusted_ca",
            Self::TrustDomain => "trust_domain",
            Self::NoClientCertificate => "no_client_certificate",
            Self::BadCertificate => "bad_certificate",
            Self::PeerRejected => "peer_rejected",
            Self::Tls => "tls",
            Self::Http2 => "http2",
            Self::NoWorkload => "no_workload",
            Self::CertUnavailable => "cert_unavailable",
            Self::PeerConnectionLimit => "peer_connection_limit",
            Self::PeerHandshakeLimit => "peer_handshake_limit",
            Self::Overload => "overload",
        }
    }
}

impl fmt::Display for HandshakeFailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An inbound connection that ended before its first stream.
#[derive(Debug, Clone)]
pub struct HandshakeFailure {
    /// The TCP peer.
    pub peer_addr: SocketAddr,
    /// The address the connection arrived on (`<pod IP>:15008`).
    pub local_addr: SocketAddr,
    pub kind: HandshakeFailureKind,
    /// What happened, for the log line.
    pub detail: String,
}

impl fmt::Display for HandshakeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

/// The first bytes the peer sent, as far as they are known.
#[derive(Debug, Clone, Default)]
pub(crate) struct FirstBytes {
    buf: [u8; PEEK_LEN],
    len: usize,
}

impl FirstBytes {
    pub(crate) fn new(buf: [u8; PEEK_LEN], len: usize) -> Self {
        Self { buf, len: len.min(PEEK_LEN) }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Not the start of a TLS handshake: then nothing rustls says about it
    /// is as useful as the bytes themselves.
    pub(crate) fn not_tls(&self) -> Option<String> {
        let b = self.bytes();
        match b.first() {
            None | Some(&TLS_HANDSHAKE_RECORD) => None,
            Some(_) if looks_like_http(b) => {
                Some(format!("plaintext HTTP on the HBONE port, not TLS (the request starts {:?})", String::from_utf8_lossy(b)))
            }
            Some(_) => Some(format!("not a TLS handshake (first bytes: {})", hex(b))),
        }
    }
}

fn looks_like_http(b: &[u8]) -> bool {
    const METHODS: [&[u8]; 9] = [b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ", b"OPTIONS ", b"PATCH ", b"CONNECT ", b"PRI * HTTP/2"];
    METHODS.iter().any(|m| b.starts_with(m) || (b.len() < m.len() && m.starts_with(b) && !b.is_empty()))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(" ")
}

/// Classifies a failed TLS accept.
pub(crate) fn classify_tls(err: &io::Error, first: &FirstBytes) -> (HandshakeFailureKind, String) {
    if let Some(detail) = first.not_tls() {
        return (HandshakeFailureKind::NotTls, detail);
    }
    let Some(tls) = err.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) else {
        return match err.kind() {
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => {
                (HandshakeFailureKind::Closed, format!("the peer closed the connection during the TLS handshake ({err})"))
            }
            _ => (HandshakeFailureKind::Tls, format!("TLS handshake: {err}")),
        };
    };
    match tls {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            (HandshakeFailureKind::UntrustedCa, "client certificate is not issued by a trusted CA (unknown issuer)".to_owned())
        }
        // A CA with the same name as ours but another key: what another
        // mesh's default root looks like.
        rustls::Error::InvalidCertificate(CertificateError::BadSignature) => (
            HandshakeFailureKind::UntrustedCa,
            "client certificate does not verify against our roots (bad signature: issued by another CA with the same name as ours)"
                .to_owned(),
        ),
        rustls::Error::InvalidCertificate(CertificateError::Other(other)) => match other.0.downcast_ref::<UntrustedPeer>() {
            Some(untrusted) => (HandshakeFailureKind::TrustDomain, untrusted.to_string()),
            None => (HandshakeFailureKind::BadCertificate, format!("client certificate rejected: {other}")),
        },
        rustls::Error::InvalidCertificate(e) => (HandshakeFailureKind::BadCertificate, format!("client certificate rejected: {e:?}")),
        rustls::Error::NoCertificatesPresented => {
            (HandshakeFailureKind::NoClientCertificate, "the client presented no certificate".to_owned())
        }
        rustls::Error::AlertReceived(alert) => (
            HandshakeFailureKind::PeerRejected,
            format!("the peer aborted the TLS handshake with alert {alert:?} (did it expect another server identity?)"),
        ),
        other => (HandshakeFailureKind::Tls, format!("TLS handshake: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(b: &[u8]) -> FirstBytes {
        let mut buf = [0; PEEK_LEN];
        let n = b.len().min(PEEK_LEN);
        buf[..n].copy_from_slice(&b[..n]);
        FirstBytes::new(buf, n)
    }

    #[test]
    fn tells_http_and_garbage_from_tls() {
        let eof = io::Error::from(io::ErrorKind::UnexpectedEof);
        let (kind, detail) = classify_tls(&eof, &first(b"GET / HTTP/1.1\r\nHost: x\r\n"));
        assert_eq!(kind, HandshakeFailureKind::NotTls);
        assert!(detail.contains("plaintext HTTP") && detail.contains("GET / HTTP/1.1"), "{detail}");
        let (kind, detail) = classify_tls(&eof, &first(&[0, 1, 0xff]));
        assert_eq!(kind, HandshakeFailureKind::NotTls);
        assert_eq!(detail, "not a TLS handshake (first bytes: 00 01 ff)");
        // A TLS record that then breaks is a closed connection, not "not TLS".
        let (kind, _) = classify_tls(&eof, &first(&[0x16, 3, 1]));
        assert_eq!(kind, HandshakeFailureKind::Closed);
    }

    #[test]
    fn names_certificate_problems() {
        let tls = first(&[0x16, 3, 1]);
        let io = |e: rustls::Error| io::Error::new(io::ErrorKind::InvalidData, e);
        let (kind, _) = classify_tls(&io(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)), &tls);
        assert_eq!(kind, HandshakeFailureKind::UntrustedCa);
        let (kind, _) = classify_tls(&io(rustls::Error::NoCertificatesPresented), &tls);
        assert_eq!(kind, HandshakeFailureKind::NoClientCertificate);
        let (kind, detail) = classify_tls(&io(rustls::Error::AlertReceived(rustls::AlertDescription::BadCertificate)), &tls);
        assert_eq!(kind, HandshakeFailureKind::PeerRejected);
        assert!(detail.contains("BadCertificate"), "{detail}");
    }
}
