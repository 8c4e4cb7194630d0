//! The HBONE server side: present the destination workload's own
//! certificate and require a client certificate from our trust domain.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, NoServerSessionStorage, ResolvesServerCert};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use rustls_pki_types::{CertificateDer, UnixTime};

use super::errors::{to_rustls, TlsError, UntrustedPeer};
use super::{provider, ALPN_H2, PROTOCOL_VERSIONS};
use crate::cert::{SharedTrust, TrustBundle, WorkloadCert};
use crate::spiffe::TrustDomain;
use crate::x509;

/// Builds server configurations that share one client verifier.
///
/// The node proxy answers for every workload on its node, each with its own
/// certificate chosen by the connection's original destination IP, so a
/// configuration is made per connection from the cached parts.
#[derive(Clone, Debug)]
pub struct ServerTls {
    verifier: Arc<dyn ClientCertVerifier>,
    refusing: Arc<ServerConfig>,
}

impl ServerTls {
    /// Client certificates must chain to `roots` and carry a SPIFFE URI SAN
    /// in `trust_domain`.
    pub fn new(roots: &TrustBundle, trust_domain: TrustDomain) -> Result<Self, TlsError> {
        Self::following(&SharedTrust::new(roots.clone()), trust_domain)
    }

    /// Like [`ServerTls::new`], with the roots read from `trust` at each
    /// handshake: when the bundle is replaced (a root rotation), the next
    /// client is verified against the new one, and connections already
    /// established are not touched.
    pub fn following(trust: &SharedTrust, trust_domain: TrustDomain) -> Result<Self, TlsError> {
        // Build the first bundle's verifier now: a bundle webpki cannot use
        // fails here rather than at the first handshake.
        trust.current().client_verifier()?;
        let verifier: Arc<dyn ClientCertVerifier> = Arc::new(TrustDomainVerifier { trust: trust.clone(), trust_domain });
        let refusing = build(verifier.clone(), Arc::new(NoCertificate))?;
        Ok(Self { verifier, refusing })
    }

    /// The configuration presenting `cert` (leaf and intermediates).
    pub fn config_for(&self, cert: &WorkloadCert) -> Result<Arc<ServerConfig>, TlsError> {
        build(self.verifier.clone(), Arc::new(SingleCertAndKey::from(cert.certified_key())))
    }

    /// A configuration that has no certificate to present: the handshake
    /// fails with a `handshake_failure` alert. Used for connections to an IP
    /// with no local workload, so they are refused rather than answered with
    /// some other workload's identity.
    pub fn refusing_config(&self) -> Arc<ServerConfig> {
        self.refusing.clone()
    }
}

fn build(verifier: Arc<dyn ClientCertVerifier>, resolver: Arc<dyn ResolvesServerCert>) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(PROTOCOL_VERSIONS)?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    // No resumption: every tunnel proves its client identity afresh.
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

#[derive(Debug)]
struct NoCertificate;

impl ResolvesServerCert for NoCertificate {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        None
    }
}

/// webpki's client verification (chain to the current roots, EKU
/// clientAuth), then the trust domain check.
#[derive(Debug)]
struct TrustDomainVerifier {
    trust: SharedTrust,
    trust_domain: TrustDomain,
}

impl TrustDomainVerifier {
    fn inner(&self) -> Result<Arc<dyn ClientCertVerifier>, rustls::Error> {
        self.trust.current().client_verifier().map_err(|e| rustls::Error::General(e.to_string()))
    }
}

impl ClientCertVerifier for TrustDomainVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hints: the roots may change under a borrowed slice, and HBONE
        // clients (ours, ztunnel) present their one certificate regardless.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner()?.verify_client_cert(end_entity, intermediates, now)?;
        // As ztunnel does: accept when any SPIFFE SAN is in our trust domain;
        // the peer identity is then the first SPIFFE SAN (docs/protocols.md 2).
        let presented = x509::spiffe_ids(end_entity).map_err(to_rustls)?;
        if presented.iter().any(|id| id.trust_domain() == &self.trust_domain) {
            Ok(ClientCertVerified::assertion())
        } else {
            Err(to_rustls(UntrustedPeer { trust_domain: self.trust_domain.clone(), presented }))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner()?.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner()?.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider().signature_verification_algorithms.supported_schemes()
    }
}
