//! Workload certificates from the control plane's certificate service
//! (docs/protocols.md section 3), the way ztunnel asks for them: a key
//! and CSR made here (the key never leaves the node proxy), the pod's
//! identity as `ImpersonatedIdentity`, the node proxy's own credentials on
//! the call.
//!
//! The answer's last element is the root bundle: it becomes the node's
//! trust ([`SharedTrust`]) when it differs from the one in force, so that
//! during a root rotation every new connection verifies against the roots
//! the control plane hands out now.

use crate::control::{ControlChannel, ControlError};
use futures_util::future::BoxFuture;
use slipstream_api::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use slipstream_api::ca::IstioCertificateRequest;
use slipstream_api::IMPERSONATED_IDENTITY;
use slipstream_core::SpiffeId;
use slipstream_identity::{generate_csr, CertError, CertificateProvider, FetchError, SharedTrust, WorkloadCert};
use std::sync::Arc;
use std::time::Duration;

/// Why the control plane did not give a usable certificate.
#[derive(Debug, thiserror::Error)]
pub enum CaClientError {
    #[error("{0}")]
    Control(#[from] ControlError),
    #[error("the control plane refused the certificate ({code:?}): {message}")]
    Refused { code: tonic::Code, message: String },
    #[error("the control plane's answer: {0}")]
    Answer(CertError),
}

/// A [`CertificateProvider`] over the control plane.
#[derive(Clone)]
pub struct RemoteCa {
    channel: ControlChannel,
    validity: Duration,
    trust: SharedTrust,
}

impl RemoteCa {
    /// `trust` starts as the roots the node was configured with
    /// (`--control-plane-root`) and follows what the control plane sends.
    pub fn new(channel: ControlChannel, validity: Duration, trust: SharedTrust) -> RemoteCa {
        RemoteCa { channel, validity, trust }
    }

    async fn fetch_now(&self, id: &SpiffeId) -> Result<WorkloadCert, FetchError> {
        let provider = |e: CaClientError| FetchError::Provider(Arc::new(e));
        let (csr, key) = generate_csr(id)?;
        let name = id.to_string();
        let req = self
            .channel
            .request(IstioCertificateRequest {
                csr,
                validity_duration: self.validity.as_secs().max(1) as i64,
                metadata: Some(slipstream_api::string_struct([(IMPERSONATED_IDENTITY, name.as_str())])),
            })
            .map_err(|e| provider(e.into()))?;
        let chain = IstioCertificateServiceClient::new(self.channel.channel())
            .create_certificate(req)
            .await
            .map_err(|s| provider(CaClientError::Refused { code: s.code(), message: s.message().to_string() }))?
            .into_inner()
            .cert_chain;
        let cert = WorkloadCert::from_istio_chain(&chain, key).map_err(|e| provider(CaClientError::Answer(e)))?;
        // As ztunnel: the certificate must be for the identity asked for,
        // whatever the CA thinks.
        if cert.identity() != id {
            return Err(FetchError::WrongIdentity { expected: id.clone(), got: cert.identity().clone() });
        }
        // And lead to the roots it came with: a bundle that does not trust
        // its own leaf would lock the node out once it became the trust.
        cert.verify_chain().map_err(|e| provider(CaClientError::Answer(e)))?;
        let before = self.trust.current().certs().len();
        if self.trust.replace(cert.roots()) {
            tracing::info!(
                roots = cert.roots().certs().len(),
                previous_roots = before,
                "trust bundle changed: new connections are verified against the control plane's current roots"
            );
        }
        tracing::debug!(identity = %id, serial = cert.serial(), "certificate from the control plane");
        Ok(cert)
    }
}

impl CertificateProvider for RemoteCa {
    fn fetch<'a>(&'a self, id: &'a SpiffeId) -> BoxFuture<'a, Result<WorkloadCert, FetchError>> {
        Box::pin(self.fetch_now(id))
    }
}
