//! slipstream-identity: SPIFFE workload identities, X.509 SVIDs, a local CA
//! and the rustls configurations HBONE uses (docs/protocols.md section 1 and the
//! TLS half of section 2).
//!
//! - identities (`slipstream_core::SpiffeId`, `spiffe://<td>/ns/<ns>/sa/<sa>`,
//!   validated once) are core's: import them from there, the one path.
//! - [`Ca`]: issues workload certificates directly or from a CSR
//!   ([`generate_csr`]) the way Istio's certificate service does.
//! - [`WorkloadCert`]: chain, key, validity; renewal at half-life.
//! - [`tls`]: client and server configurations, peer identity.
//! - [`CertManager`]: per-identity cache with background renewal over a
//!   [`CertificateProvider`].

#![forbid(unsafe_code)]

mod ca;
mod cert;
mod crypto;
mod csr;
mod error;
mod manager;
mod pem;
mod provider;
pub mod tls;
mod x509;

pub use ca::{ca_validity_problem, Ca, CaValidityProblem, CLOCK_SKEW_ALLOWANCE, DEFAULT_WORKLOAD_VALIDITY, ROOT_VALIDITY};
pub use cert::{SharedTrust, TrustBundle, WorkloadCert, WorkloadKey};
pub use csr::{generate_csr, Csr};
pub use error::{CertError, CsrError};
pub use manager::{CertManager, CertManagerConfig, CertStatus, CertSummary};
pub use provider::{CertificateProvider, FetchError, LocalCaProvider};
// The identity type is pure and lives in `slipstream_core::spiffe`, where
// the mesh model validates identities as resources arrive; this crate's
// modules name it as `crate::spiffe`, its users as `slipstream_core`.
use slipstream_core::spiffe;
pub use x509::{certificate_validity, format_time, SanError};
