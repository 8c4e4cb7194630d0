//! The HBONE client side: present the source workload's certificate and
//! accept the server only by its SPIFFE identity.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, Resumption};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::server::ParsedCertificate;
use rustls::sign::SingleCertAndKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::errors::{to_rustls, IdentityMismatch, TlsError};
use super::{provider, ALPN_H2, PROTOCOL_VERSIONS};
use crate::cert::{TrustBundle, WorkloadCert};
use crate::spiffe::SpiffeId;
use crate::x509;

/// A client configuration for one HBONE dial: presents `cert`, trusts
/// `roots`, and accepts the server only if its leaf carries one of
/// `expected` as a URI SAN.
///
/// The caller still passes a `ServerName` to the connector; it is neither
/// sent (SNI is off) nor checked.
pub fn client_config(cert: &WorkloadCert, roots: &TrustBundle, expected: &[SpiffeId]) -> Result<Arc<ClientConfig>, TlsError> {
    if expected.is_empty() {
        return Err(TlsError::NoExpectedIdentity);
    }
    let provider = provider();
    let verifier = SpiffeServerVerifier {
        roots: roots.root_store(),
        expected: expected.to_vec(),
        algorithms: provider.signature_verification_algorithms,
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(PROTOCOL_VERSIONS)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(cert.certified_key())));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    // Peers are addressed by IP and identified by SAN: a host name means
    // nothing here, and ztunnel sends none.
    config.enable_sni = false;
    // Every HBONE connection is a full handshake (ztunnel does not resume):
    // a resumed session would skip the identity check of the new peer.
    config.resumption = Resumption::disabled();
    Ok(Arc::new(config))
}

/// Chain validation as webpki does it (including EKU serverAuth), then the
/// identity check in place of a host name check.
#[derive(Debug)]
struct SpiffeServerVerifier {
    roots: Arc<RootCertStore>,
    expected: Vec<SpiffeId>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(&parsed, &self.roots, intermediates, now, self.algorithms.all)?;
        // Like ztunnel: accept if any SPIFFE URI SAN of the leaf is expected.
        // Istio leaves carry exactly one.
        let presented = x509::spiffe_ids(end_entity).map_err(to_rustls)?;
        if presented.iter().any(|id| self.expected.contains(id)) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(to_rustls(IdentityMismatch { expected: self.expected.clone(), presented }))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
