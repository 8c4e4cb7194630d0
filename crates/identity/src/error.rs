//! Errors of certificate handling: PEM/X.509 parsing, the CA, CSRs.

use std::path::PathBuf;

use crate::csr::CsrError;
use crate::spiffe::SpiffeId;

/// Anything that can go wrong creating, loading, signing or parsing
/// certificates and keys. Each variant says what the operator has to fix.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("malformed PEM: {0}")]
    Pem(String),
    #[error("{what}: no {label} block found in the PEM input")]
    PemMissing { what: &'static str, label: &'static str },
    #[error("malformed X.509 certificate: {0}")]
    X509(String),
    #[error("the private key is not usable: {0}")]
    Key(String),
    #[error("the private key does not belong to the certificate")]
    KeyMismatch,
    #[error("the CA certificate is not a CA (basicConstraints CA:true is missing)")]
    NotACa,
    #[error("the CA does not chain to the root bundle: {0}")]
    Chain(String),
    #[error("signing failed: {0}")]
    Signing(#[from] rcgen::Error),
    #[error("certificate signing request refused: {0}")]
    Csr(#[from] CsrError),
    #[error("CSR identity refused: expected exactly one URI SAN {expected}, the CSR asks for {found:?}")]
    CsrIdentity { expected: SpiffeId, found: Vec<String> },
    #[error("workload certificate identity: {0}")]
    LeafIdentity(String),
    #[error("invalid validity: {0}")]
    Validity(String),
    /// The CA's signing certificate cannot issue now (or not for long).
    #[error("the CA certificate{file} {problem} (valid from {not_before} to {not_after}; now {now})")]
    CaValidity { file: String, problem: String, not_before: String, not_after: String, now: String },
    #[error("the certificate chain is empty or holds no root bundle")]
    IncompleteChain,
    #[error("TLS rejected the certificate or key: {0}")]
    Tls(#[from] rustls::Error),
}
