//! Certificate signing requests, the way Istio's certificate service takes
//! them: PEM PKCS#10, empty subject, one URI SAN, ECDSA P-256 key.

use rcgen::{CertificateParams, CertificateSigningRequestParams, DistinguishedName, KeyPair, SanType};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY};
use x509_parser::prelude::FromDer;

use crate::cert::WorkloadKey;
use crate::error::CertError;
use crate::spiffe::SpiffeId;

/// Generates a fresh ECDSA P-256 key and a CSR asking for `id`.
///
/// The key never leaves the caller: only the CSR goes to the CA.
pub fn generate_csr(id: &SpiffeId) -> Result<(String, WorkloadKey), CertError> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::default();
    // Istio's agents send an empty subject: the identity is only the SAN.
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = vec![SanType::URI(id.to_string().try_into()?)];
    let csr = params.serialize_request(&key)?;
    Ok((csr.pem()?, WorkloadKey::from_pkcs8(key.serialize_der())))
}

/// A CSR whose signature, key type and identity have been checked.
pub(crate) struct VerifiedCsr {
    pub public_key: rcgen::PublicKey,
}

/// Parses `csr_pem`, checks its self-signature, that its key is ECDSA P-256
/// and that it asks for exactly one SAN: the URI `expected`.
pub(crate) fn verify_csr(csr_pem: &str, expected: &SpiffeId) -> Result<VerifiedCsr, CertError> {
    let der = match rustls_pemfile::csr(&mut csr_pem.as_bytes()) {
        Ok(Some(der)) => der,
        Ok(None) => return Err(CertError::PemMissing { what: "CSR", label: "CERTIFICATE REQUEST" }),
        Err(e) => return Err(CertError::Pem(format!("CSR: {e}"))),
    };

    let (_, parsed) = X509CertificationRequest::from_der(der.as_ref()).map_err(|e| CertError::Csr(e.to_string()))?;
    let spki = &parsed.certification_request_info.subject_pki;
    let curve = spki.algorithm.parameters.as_ref().and_then(|p| p.as_oid().ok());
    if spki.algorithm.algorithm != OID_KEY_TYPE_EC_PUBLIC_KEY || curve.as_ref() != Some(&OID_EC_P256) {
        return Err(CertError::CsrKeyType(format!(
            "algorithm {}, parameters {:?}",
            spki.algorithm.algorithm,
            curve.map(|c| c.to_id_string())
        )));
    }

    // rcgen checks the CSR's self-signature (proof of possession of the key).
    let params = CertificateSigningRequestParams::from_der(&der)
        .map_err(|e| CertError::Csr(format!("{e} (or the CSR signature does not verify)")))?;
    let found: Vec<String> = params
        .params
        .subject_alt_names
        .iter()
        .map(|san| match san {
            SanType::URI(uri) => uri.as_str().to_owned(),
            other => format!("{other:?}"),
        })
        .collect();
    let wanted = expected.to_string();
    let exact = matches!(
        params.params.subject_alt_names.as_slice(),
        [SanType::URI(uri)] if uri.as_str() == wanted
    );
    if !exact {
        return Err(CertError::CsrIdentity { expected: expected.clone(), found });
    }
    Ok(VerifiedCsr { public_key: params.public_key })
}
