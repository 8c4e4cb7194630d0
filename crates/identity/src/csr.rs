//! Certificate signing requests, the way Istio's certificate service takes
//! them: PEM PKCS#10, empty subject, one URI SAN, ECDSA P-256 key.

use rcgen::{CertificateParams, DistinguishedName, KeyPair, SanType, SubjectPublicKeyInfo};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY};
use x509_parser::prelude::FromDer;

use crate::cert::WorkloadKey;
use crate::error::{CertError, CsrError};
use crate::spiffe::{SpiffeId, SPIFFE_PREFIX};

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

/// A CSR whose signature, key type and single SPIFFE identity have been
/// checked: what a CA needs to sign it.
pub struct Csr {
    identity: SpiffeId,
    public_key: SubjectPublicKeyInfo,
}

impl Csr {
    /// Parses a PEM PKCS#10 request and checks, in this order: PEM, DER,
    /// self-signature, key type (ECDSA P-256), and that its only subject
    /// alternative name is one URI that is a SPIFFE workload identity.
    /// The subject is ignored: the certificate's identity is the SAN alone.
    pub fn parse(pem: &str) -> Result<Csr, CsrError> {
        let der = match rustls_pemfile::csr(&mut pem.as_bytes()) {
            Ok(Some(der)) => der,
            Ok(None) => return Err(CsrError::NoPemBlock),
            Err(e) => return Err(CsrError::Pem(e.to_string())),
        };
        let (rest, parsed) = X509CertificationRequest::from_der(der.as_ref()).map_err(|e| CsrError::Der(e.to_string()))?;
        if !rest.is_empty() {
            return Err(CsrError::Der("trailing bytes after the request".into()));
        }
        parsed.verify_signature().map_err(|_| CsrError::BadSignature)?;

        let info = &parsed.certification_request_info;
        let spki = &info.subject_pki;
        let curve = spki.algorithm.parameters.as_ref().and_then(|p| p.as_oid().ok());
        if spki.algorithm.algorithm != OID_KEY_TYPE_EC_PUBLIC_KEY || curve.as_ref() != Some(&OID_EC_P256) {
            return Err(CsrError::KeyType(format!(
                "algorithm {}, parameters {}",
                spki.algorithm.algorithm,
                curve.map(|c| c.to_id_string()).unwrap_or_else(|| "none".into())
            )));
        }

        let mut uris = Vec::new();
        let mut others = Vec::new();
        for ext in parsed.requested_extensions().into_iter().flatten() {
            if let ParsedExtension::SubjectAlternativeName(san) = ext {
                for name in &san.general_names {
                    match name {
                        GeneralName::URI(uri) => uris.push((*uri).to_owned()),
                        other => others.push(other.to_string()),
                    }
                }
            }
        }
        let identity = match (uris.as_slice(), others.is_empty()) {
            ([], true) => return Err(CsrError::NoSan),
            (_, false) => return Err(CsrError::OtherNames(others)),
            ([uri], true) => {
                if !uri.starts_with(SPIFFE_PREFIX) {
                    return Err(CsrError::NotSpiffe { uri: uri.clone(), reason: format!("it does not start with {SPIFFE_PREFIX}") });
                }
                uri.parse::<SpiffeId>().map_err(|e| CsrError::NotSpiffe { uri: uri.clone(), reason: e.to_string() })?
            }
            _ => return Err(CsrError::SeveralIdentities(uris)),
        };
        let public_key = SubjectPublicKeyInfo::from_der(spki.raw).map_err(|e| CsrError::KeyType(e.to_string()))?;
        Ok(Csr { identity, public_key })
    }

    /// The one identity the CSR asks for.
    pub fn identity(&self) -> &SpiffeId {
        &self.identity
    }

    pub(crate) fn public_key(&self) -> &SubjectPublicKeyInfo {
        &self.public_key
    }
}

impl std::fmt::Debug for Csr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Csr").field("identity", &self.identity).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr_with(sans: Vec<SanType>, alg: &'static rcgen::SignatureAlgorithm) -> String {
        let key = KeyPair::generate_for(alg).unwrap();
        let mut params = CertificateParams::default();
        params.subject_alt_names = sans;
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    fn uri(s: &str) -> SanType {
        SanType::URI(s.try_into().unwrap())
    }

    #[test]
    fn refusals_name_the_problem() {
        let p256 = &rcgen::PKCS_ECDSA_P256_SHA256;
        let good = "spiffe://cluster.local/ns/default/sa/web";
        let cases: Vec<(String, CsrError)> = vec![
            ("not pem at all".into(), CsrError::NoPemBlock),
            ("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n".into(), CsrError::Der(String::new())),
            (csr_with(vec![], p256), CsrError::NoSan),
            (csr_with(vec![uri(good), SanType::DnsName("evil.example".try_into().unwrap())], p256), CsrError::OtherNames(vec![])),
            (csr_with(vec![uri(good), uri("spiffe://cluster.local/ns/default/sa/admin")], p256), CsrError::SeveralIdentities(vec![])),
            (
                csr_with(vec![uri("https://cluster.local/ns/default/sa/web")], p256),
                CsrError::NotSpiffe { uri: String::new(), reason: String::new() },
            ),
            (
                csr_with(vec![uri("spiffe://cluster.local/ns/default/web")], p256),
                CsrError::NotSpiffe { uri: String::new(), reason: String::new() },
            ),
            (csr_with(vec![uri(good)], &rcgen::PKCS_ECDSA_P384_SHA384), CsrError::KeyType(String::new())),
        ];
        for (pem, want) in cases {
            let got = Csr::parse(&pem).unwrap_err();
            assert_eq!(std::mem::discriminant(&got), std::mem::discriminant(&want), "{got}");
        }
        let two = Csr::parse(&csr_with(vec![uri(good), uri("spiffe://cluster.local/ns/default/sa/admin")], p256)).unwrap_err();
        assert_eq!(
            two.to_string(),
            "the CSR asks for 2 identities ([\"spiffe://cluster.local/ns/default/sa/web\", \"spiffe://cluster.local/ns/default/sa/admin\"]): exactly one is allowed"
        );
        let ok = Csr::parse(&csr_with(vec![uri(good)], p256)).unwrap();
        assert_eq!(ok.identity().to_string(), good);
    }

    /// Made by `openssl req` with an empty subject and a critical URI SAN,
    /// the shape ztunnel's BoringSSL and OpenSSL builds send.
    const OPENSSL_CSR: &str = "-----BEGIN CERTIFICATE REQUEST-----\n\
MIIBBDCBqwIBADAAMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEsOvIY8+DRZAh\n\
0IPtHvBoUG0ZNg3Z3vXT5FQGcppP1dX3QwJ0sJ9Or2gU9I+e7WWNdovfbAVABEum\n\
9+Q4g/UeEaBJMEcGCSqGSIb3DQEJDjE6MDgwNgYDVR0RAQH/BCwwKoYoc3BpZmZl\n\
Oi8vY2x1c3Rlci5sb2NhbC9ucy9kZWZhdWx0L3NhL3dlYjAKBggqhkjOPQQDAgNI\n\
ADBFAiAxD/vZ3vgxCP4Hv2q3jJOG/xzWIkSoul3qXJBK4HIS2QIhAO/SVlWLSgjH\n\
f/wKfYS2LSCEcWilcGyP3qdtiPj0UH/X\n\
-----END CERTIFICATE REQUEST-----\n";

    #[test]
    fn a_request_made_by_openssl_is_read() {
        let csr = Csr::parse(OPENSSL_CSR).unwrap();
        assert_eq!(csr.identity().to_string(), "spiffe://cluster.local/ns/default/sa/web");
    }

    #[test]
    fn a_tampered_request_fails_its_signature() {
        let id: SpiffeId = "spiffe://cluster.local/ns/default/sa/web".parse().unwrap();
        let (pem, _) = generate_csr(&id).unwrap();
        let der = rustls_pemfile::csr(&mut pem.as_bytes()).unwrap().unwrap();
        let mut bytes = der.as_ref().to_vec();
        // The last byte belongs to the signature.
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        let tampered = ::pem::encode(&::pem::Pem::new("CERTIFICATE REQUEST", bytes));
        assert_eq!(Csr::parse(&tampered).unwrap_err(), CsrError::BadSignature);
        // And one whose SAN was changed after signing.
        let mut swapped = der.as_ref().to_vec();
        let at = swapped.windows(3).position(|w| w == b"web").unwrap();
        swapped[at..at + 3].copy_from_slice(b"adm");
        let swapped = ::pem::encode(&::pem::Pem::new("CERTIFICATE REQUEST", swapped));
        assert_eq!(Csr::parse(&swapped).unwrap_err(), CsrError::BadSignature);
    }
}
