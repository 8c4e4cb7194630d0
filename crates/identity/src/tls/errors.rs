//! TLS errors, and the verification failures the data path must tell apart.

use std::error::Error as StdError;
use std::fmt;

use rustls::CertificateError;

use crate::spiffe::{SpiffeId, TrustDomain};
use crate::x509::SanError;

/// Building a TLS configuration or reading the peer identity failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("TLS verifier configuration: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("an HBONE client needs at least one expected server identity")]
    NoExpectedIdentity,
    #[error("the peer presented no certificate")]
    NoPeerCertificate,
    #[error("the peer certificate: {0}")]
    PeerSan(#[from] SanError),
    #[error("the peer certificate carries no SPIFFE URI SAN")]
    NoSpiffeId,
}

/// The server's certificate chains to our roots but names none of the
/// identities we expected. Carried inside the rustls handshake error so the
/// caller can report an identity error rather than a generic TLS failure;
/// find it with [`identity_mismatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityMismatch {
    pub expected: Vec<SpiffeId>,
    pub presented: Vec<SpiffeId>,
}

impl fmt::Display for IdentityMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "server identity mismatch: expected one of {:?}, the certificate names {:?}", self.expected, self.presented)
    }
}

impl StdError for IdentityMismatch {}

/// A client certificate chains to our roots but carries no SPIFFE identity in
/// our trust domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UntrustedPeer {
    pub trust_domain: TrustDomain,
    pub presented: Vec<SpiffeId>,
}

impl fmt::Display for UntrustedPeer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client certificate has no SPIFFE identity in trust domain {}: it names {:?}", self.trust_domain, self.presented)
    }
}

impl StdError for UntrustedPeer {}

pub(crate) fn to_rustls(err: impl StdError + Send + Sync + 'static) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(std::sync::Arc::new(err))))
}

/// Finds an [`IdentityMismatch`] in an error returned by a TLS handshake
/// (an `io::Error` from tokio-rustls, a `rustls::Error`, or anything whose
/// source chain holds one of those).
pub fn identity_mismatch<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a IdentityMismatch> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<IdentityMismatch>() {
            return Some(found);
        }
        if let Some(rustls::Error::InvalidCertificate(CertificateError::Other(other))) = e.downcast_ref::<rustls::Error>() {
            return other.0.downcast_ref::<IdentityMismatch>();
        }
        // io::Error::source() skips the wrapped error itself; look inside.
        current = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as &(dyn StdError + 'static)),
            None => e.source(),
        };
    }
    None
}
