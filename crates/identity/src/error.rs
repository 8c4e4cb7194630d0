//! Errors of certificate handling: PEM/X.509 parsing, the CA, CSRs.

use std::path::PathBuf;

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

/// Why a CSR cannot be signed. Each message names the problem so that the
/// requester (and the CA's log) can tell a broken client from a hostile one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    #[error("malformed PEM: {0}")]
    Pem(String),
    #[error("no CERTIFICATE REQUEST block in the PEM input")]
    NoPemBlock,
    #[error("malformed PKCS#10 DER: {0}")]
    Der(String),
    #[error("the CSR's signature does not verify with its own key (no proof of possession)")]
    BadSignature,
    #[error("key type refused: {0} (workload keys must be ECDSA P-256)")]
    KeyType(String),
    #[error("the CSR asks for no subject alternative name: exactly one SPIFFE URI is required")]
    NoSan,
    #[error("the CSR asks for names other than a URI ({0:?}): exactly one SPIFFE URI is required")]
    OtherNames(Vec<String>),
    #[error("the CSR asks for {n} identities ({list:?}): exactly one is allowed", n = .0.len(), list = .0)]
    SeveralIdentities(Vec<String>),
    #[error("the URI SAN {uri:?} is not a SPIFFE workload identity: {reason}")]
    NotSpiffe { uri: String, reason: String },
}
