//! A certificate authority that issues workload X.509 SVIDs.
//!
//! It either generates its own self-signed root or uses an operator-provided
//! signing certificate and key (a root, or an intermediate below a root
//! bundle), like Istio's "plug-in CA certificates".

use std::path::Path;
use std::time::{Duration, SystemTime};

use rand::RngCore;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, CustomExtension, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, PublicKeyData, SerialNumber,
};
use rustls::server::ParsedCertificate;
use rustls_pki_types::{CertificateDer, UnixTime};

use crate::cert::{TrustBundle, WorkloadCert, WorkloadKey};
use crate::csr;
use crate::error::CertError;
use crate::pem;
use crate::spiffe::{SpiffeId, TrustDomain};
use crate::x509;

/// Lifetime of a generated root.
pub const ROOT_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Default lifetime of a workload certificate.
pub const DEFAULT_WORKLOAD_VALIDITY: Duration = Duration::from_secs(24 * 3600);
/// How far notBefore is set in the past so that a peer whose clock is a
/// little behind still accepts a fresh certificate.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(60);

/// The OID of the subjectAltName extension (2.5.29.17).
const OID_SUBJECT_ALT_NAME: [u64; 4] = [2, 5, 29, 17];

/// Issues workload certificates.
pub struct Ca {
    /// The signing certificate as rcgen needs it for issuing (its subject and
    /// key identifier); never serialized itself.
    issuer: Certificate,
    issuer_key: KeyPair,
    /// Certificates between an issued leaf and the roots, issuer first.
    /// Empty when the issuer is itself one of the roots.
    intermediates: Vec<CertificateDer<'static>>,
    roots: TrustBundle,
    /// The signing certificate as provided (or generated), for export.
    issuer_der: CertificateDer<'static>,
}

impl Ca {
    /// Generates a self-signed ECDSA P-256 root valid for ten years.
    pub fn generate(trust_domain: &TrustDomain) -> Result<Self, CertError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let now = SystemTime::now();
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        // Istio's self-signed root carries O=<trust domain>.
        dn.push(DnType::OrganizationName, trust_domain.as_str());
        dn.push(DnType::CommonName, "Slipstream root CA");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.serial_number = Some(random_serial());
        params.not_before = to_offset(now - CLOCK_SKEW_ALLOWANCE);
        params.not_after = to_offset(now + ROOT_VALIDITY);
        let cert = params.self_signed(&key)?;
        let der = cert.der().clone();
        Ok(Self {
            roots: TrustBundle::from_der(vec![der.clone()])?,
            issuer: cert,
            issuer_key: key,
            intermediates: Vec::new(),
            issuer_der: der,
        })
    }

    /// Loads an operator's CA.
    ///
    /// `cert_chain_pem` holds the signing certificate first, optionally
    /// followed by its intermediates. `root_bundle_pem` holds one or more
    /// roots; without it, the signing certificate must be a self-signed root
    /// and is the only root. The CA proves the configuration by issuing and
    /// verifying a probe certificate, so a bad combination fails here rather
    /// than at the first handshake.
    pub fn from_pem(cert_chain_pem: &str, key_pem: &str, root_bundle_pem: Option<&str>) -> Result<Self, CertError> {
        let chain = pem::certs(cert_chain_pem, "CA certificate")?;
        let issuer_der = chain[0].clone();
        let key_der = pem::private_key(key_pem, "CA key")?;
        let issuer_key = KeyPair::try_from(&key_der).map_err(|e| CertError::Key(format!("CA key: {e}")))?;

        let parsed = x509::parse_cert(&issuer_der)?;
        if !parsed.is_ca() {
            return Err(CertError::NotACa);
        }
        if parsed.public_key().raw != issuer_key.public_key_der().as_slice() {
            return Err(CertError::KeyMismatch);
        }

        let roots = match root_bundle_pem {
            Some(bundle) => TrustBundle::from_pem(bundle)?,
            None => TrustBundle::from_der(vec![issuer_der.clone()])?,
        };
        let intermediates: Vec<_> = chain.into_iter().filter(|c| !roots.contains(c)).collect();

        let issuer = CertificateParams::from_ca_cert_der(&issuer_der)?.self_signed(&issuer_key)?;
        let ca = Self { issuer, issuer_key, intermediates, roots, issuer_der };
        ca.self_check()?;
        Ok(ca)
    }

    /// [`Ca::from_pem`] reading files. `roots` may hold several roots.
    pub fn from_pem_files(cert: &Path, key: &Path, roots: Option<&Path>) -> Result<Self, CertError> {
        let roots = roots.map(pem::read_file).transpose()?;
        Self::from_pem(&pem::read_file(cert)?, &pem::read_file(key)?, roots.as_deref())
    }

    /// The roots every issued certificate chains to.
    pub fn roots(&self) -> &TrustBundle {
        &self.roots
    }

    /// The signing certificate in PEM (to persist a generated root).
    pub fn cert_pem(&self) -> String {
        pem::encode("CERTIFICATE", self.issuer_der.as_ref())
    }

    /// The signing key in PKCS#8 PEM (to persist a generated root).
    pub fn key_pem(&self) -> String {
        self.issuer_key.serialize_pem()
    }

    /// Issues a certificate for `id` with a freshly generated key.
    pub fn issue(&self, id: &SpiffeId, validity: Duration) -> Result<WorkloadCert, CertError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let leaf = self.sign(id, validity, &key)?;
        let mut chain = vec![leaf];
        chain.extend(self.intermediates.iter().cloned());
        WorkloadCert::new(chain, self.roots.clone(), WorkloadKey::from_pkcs8(key.serialize_der()))
    }

    /// Signs a PEM CSR the way Istio's certificate service does, refusing it
    /// unless its only SAN is exactly `expected` (the identity the caller is
    /// entitled to; deciding that is the caller's job).
    ///
    /// Returns `cert_chain` in Istio's shape: leaf, intermediates, and the
    /// root bundle as the last element.
    pub fn sign_csr(&self, csr_pem: &str, validity: Duration, expected: &SpiffeId) -> Result<Vec<String>, CertError> {
        let csr = csr::verify_csr(csr_pem, expected)?;
        let leaf = self.sign(expected, validity, &csr.public_key)?;
        let mut out = Vec::with_capacity(self.intermediates.len() + 2);
        out.push(pem::encode("CERTIFICATE", leaf.as_ref()));
        out.extend(self.intermediates.iter().map(|c| pem::encode("CERTIFICATE", c.as_ref())));
        out.push(self.roots.to_pem());
        Ok(out)
    }

    fn sign(&self, id: &SpiffeId, validity: Duration, public_key: &impl PublicKeyData) -> Result<CertificateDer<'static>, CertError> {
        if validity.is_zero() {
            return Err(CertError::Validity("a certificate needs a non-zero lifetime".into()));
        }
        let now = SystemTime::now();
        // Backdate for clock skew, but never by more than a tenth of the
        // lifetime: with very short lifetimes (tests, aggressive rotation) a
        // full allowance would put the half-life renewal point in the past.
        let backdate = CLOCK_SKEW_ALLOWANCE.min(validity / 10);
        let mut params = CertificateParams::default();
        // Empty subject, like Istio's workload certificates: the identity is
        // the URI SAN alone.
        params.distinguished_name = DistinguishedName::new();
        // RFC 5280 requires the SAN extension to be critical when the subject
        // is empty; rcgen always writes it non-critical, so encode it here.
        params.custom_extensions = vec![critical_uri_san(&id.to_string())];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial());
        params.not_before = to_offset(now - backdate);
        params.not_after = to_offset(now + validity);
        let cert = params.signed_by(public_key, &self.issuer, &self.issuer_key)?;
        Ok(cert.der().clone())
    }

    /// Issues a probe leaf and verifies it against the roots, as a TLS peer
    /// would. Catches an issuer that does not chain to the bundle, an expired
    /// or non-signing CA, and subject names that rcgen would re-encode
    /// differently from the original certificate.
    fn self_check(&self) -> Result<(), CertError> {
        let probe_id = SpiffeId::new("probe.invalid", "probe", "probe").expect("static identity is valid");
        let probe = self.issue(&probe_id, Duration::from_secs(600))?;
        let leaf = ParsedCertificate::try_from(probe.leaf()).map_err(|e| CertError::Chain(e.to_string()))?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &leaf,
            &self.roots.root_store(),
            &probe.chain()[1..],
            UnixTime::now(),
            crate::tls::provider().signature_verification_algorithms.all,
        )
        .map_err(|e| CertError::Chain(e.to_string()))
    }
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("intermediates", &self.intermediates.len()).field("roots", &self.roots).finish_non_exhaustive()
    }
}

/// A positive, non-zero 128-bit serial (RFC 5280 allows up to 20 octets).
fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

fn to_offset(t: SystemTime) -> time::OffsetDateTime {
    // X.509 times have whole-second precision.
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).expect("the clock is after 1970").as_secs();
    time::OffsetDateTime::from_unix_timestamp(secs as i64).expect("timestamp in range")
}

/// subjectAltName = SEQUENCE { [6] IA5String uri }, marked critical.
fn critical_uri_san(uri: &str) -> CustomExtension {
    let mut general_name = vec![0x86];
    push_der_len(&mut general_name, uri.len());
    general_name.extend_from_slice(uri.as_bytes());
    let mut names = vec![0x30];
    push_der_len(&mut names, general_name.len());
    names.extend_from_slice(&general_name);
    let mut ext = CustomExtension::from_oid_content(&OID_SUBJECT_ALT_NAME, names);
    ext.set_criticality(true);
    ext
}

fn push_der_len(out: &mut Vec<u8>, len: usize) {
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let first = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len() - 1);
        out.push(0x80 | (bytes.len() - first) as u8);
        out.extend_from_slice(&bytes[first..]);
    }
}
