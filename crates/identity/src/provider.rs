//! Where workload certificates come from: the local CA now, Istio's
//! certificate service (section 3) later, behind one trait.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::ca::Ca;
use crate::cert::WorkloadCert;
use crate::csr::generate_csr;
use crate::error::CertError;
use crate::spiffe::SpiffeId;

/// Obtaining a certificate failed. Cheap to clone: one failure is handed to
/// every caller that was waiting on the same fetch.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchError {
    #[error("issuing the certificate: {0}")]
    Certificate(Arc<CertError>),
    #[error("certificate provider: {0}")]
    Provider(Arc<dyn StdError + Send + Sync>),
    #[error("the provider returned a certificate for {got}, not for {expected}")]
    WrongIdentity { expected: SpiffeId, got: SpiffeId },
    #[error("the certificate for {0} expired and could not be renewed")]
    Expired(SpiffeId),
    #[error("the certificate for {0} is no longer managed")]
    Forgotten(SpiffeId),
}

impl From<CertError> for FetchError {
    fn from(e: CertError) -> Self {
        Self::Certificate(Arc::new(e))
    }
}

/// A source of workload certificates.
///
/// Object-safe (returns a boxed future) so the node proxy can choose the
/// provider at start-up from configuration.
pub trait CertificateProvider: Send + Sync + 'static {
    fn fetch<'a>(&'a self, id: &'a SpiffeId) -> BoxFuture<'a, Result<WorkloadCert, FetchError>>;
}

/// Issues certificates from an in-process CA, through the same CSR flow a
/// remote Istio CA uses, so the key is generated here and only the CSR
/// crosses to the signer.
#[derive(Clone, Debug)]
pub struct LocalCaProvider {
    ca: Arc<Ca>,
    validity: Duration,
}

impl LocalCaProvider {
    pub fn new(ca: Arc<Ca>, validity: Duration) -> Self {
        Self { ca, validity }
    }

    fn fetch_now(&self, id: &SpiffeId) -> Result<WorkloadCert, FetchError> {
        let (csr, key) = generate_csr(id)?;
        let chain = self.ca.sign_csr(&csr, self.validity, id)?;
        Ok(WorkloadCert::from_istio_chain(&chain, key)?)
    }
}

impl CertificateProvider for LocalCaProvider {
    fn fetch<'a>(&'a self, id: &'a SpiffeId) -> BoxFuture<'a, Result<WorkloadCert, FetchError>> {
        // Key generation and signing take well under a millisecond: not
        // worth a blocking-pool hop.
        Box::pin(async move { self.fetch_now(id) })
    }
}
