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
use crate::csr::Csr;
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
    /// notBefore and notAfter of the signing certificate.
    window: (SystemTime, SystemTime),
    /// The earliest notAfter of the signing certificate and its
    /// intermediates: no issued certificate outlives it.
    chain_not_after: SystemTime,
    /// Where the signing certificate came from, for messages (" /path/x.pem").
    source: String,
}

/// Why a CA should not issue: its window does not hold `now`, or it ends
/// before a certificate issued now would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaValidityProblem {
    NotYetValid,
    Expired,
    /// It ends sooner than the lifetime its certificates need.
    ExpiresSoon {
        left: Duration,
        needed: Duration,
    },
}

impl std::fmt::Display for CaValidityProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotYetValid => f.write_str("is not valid yet"),
            Self::Expired => f.write_str("has expired"),
            Self::ExpiresSoon { left, needed } => write!(
                f,
                "expires in {}, within the {} lifetime of a workload certificate (renew it, or certificates would be cut short and the mesh would stop when it expires)",
                human(*left),
                human(*needed)
            ),
        }
    }
}

/// The validity decision, pure: `needed` is how long certificates issued
/// now should live (zero: only "valid now" matters).
pub fn ca_validity_problem(not_before: SystemTime, not_after: SystemTime, now: SystemTime, needed: Duration) -> Option<CaValidityProblem> {
    if now < not_before {
        return Some(CaValidityProblem::NotYetValid);
    }
    let left = not_after.duration_since(now).unwrap_or_default();
    if left.is_zero() {
        return Some(CaValidityProblem::Expired);
    }
    (left < needed).then_some(CaValidityProblem::ExpiresSoon { left, needed })
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        _ if s % 3600 < 60 => format!("{} h", s / 3600),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
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
        let window = x509::validity(&der)?;
        Ok(Self {
            roots: TrustBundle::from_der(vec![der.clone()])?,
            issuer: cert,
            issuer_key: key,
            intermediates: Vec::new(),
            issuer_der: der,
            window,
            chain_not_after: window.1,
            source: String::new(),
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
        Self::load(cert_chain_pem, key_pem, root_bundle_pem, String::new())
    }

    fn load(cert_chain_pem: &str, key_pem: &str, root_bundle_pem: Option<&str>, source: String) -> Result<Self, CertError> {
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
        let window = x509::validity(&issuer_der)?;
        let mut chain_not_after = window.1;
        for c in &intermediates {
            chain_not_after = chain_not_after.min(x509::validity(c)?.1);
        }

        let issuer = CertificateParams::from_ca_cert_der(&issuer_der)?.self_signed(&issuer_key)?;
        let ca = Self { issuer, issuer_key, intermediates, roots, issuer_der, window, chain_not_after, source };
        // An expired or not-yet-valid CA would issue certificates that every
        // peer (OpenSSL, rustls) refuses: an error now, not at the first handshake.
        ca.check_lifetime(Duration::ZERO)?;
        ca.self_check()?;
        Ok(ca)
    }

    /// [`Ca::from_pem`], naming `cert_file` (where the signing certificate
    /// came from) in validity errors.
    pub fn from_pem_named(cert_chain_pem: &str, key_pem: &str, root_bundle_pem: Option<&str>, cert_file: &Path) -> Result<Self, CertError> {
        Self::load(cert_chain_pem, key_pem, root_bundle_pem, format!(" {}", cert_file.display()))
    }

    /// [`Ca::from_pem`] reading files. `roots` may hold several roots.
    pub fn from_pem_files(cert: &Path, key: &Path, roots: Option<&Path>) -> Result<Self, CertError> {
        let roots = roots.map(pem::read_file).transpose()?;
        Self::load(&pem::read_file(cert)?, &pem::read_file(key)?, roots.as_deref(), format!(" {}", cert.display()))
    }

    /// notBefore and notAfter of the signing certificate.
    pub fn validity(&self) -> (SystemTime, SystemTime) {
        self.window
    }

    /// The latest notAfter any certificate it issues can have.
    pub fn not_after(&self) -> SystemTime {
        self.chain_not_after
    }

    /// Refuses a CA that is not valid now, or that ends (itself or an
    /// intermediate) before certificates issued now for `needed` would.
    pub fn check_lifetime(&self, needed: Duration) -> Result<(), CertError> {
        let now = SystemTime::now();
        match ca_validity_problem(self.window.0, self.chain_not_after, now, needed) {
            None => Ok(()),
            Some(p) => Err(CertError::CaValidity {
                file: self.source.clone(),
                problem: p.to_string(),
                not_before: x509::format_time(self.window.0),
                not_after: x509::format_time(self.chain_not_after),
                now: x509::format_time(now),
            }),
        }
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
        let csr = Csr::parse(csr_pem)?;
        if csr.identity() != expected {
            return Err(CertError::CsrIdentity { expected: expected.clone(), found: vec![csr.identity().to_string()] });
        }
        self.sign_request(&csr, validity)
    }

    /// Signs a checked CSR for the identity it asks for (whether the caller
    /// may have it is the caller's decision). `cert_chain` in Istio's
    /// shape: leaf, each intermediate, and the whole root bundle as the last
    /// element (docs/protocols.md section 3; ztunnel splits that last element
    /// into every root it holds).
    pub fn sign_request(&self, csr: &Csr, validity: Duration) -> Result<Vec<String>, CertError> {
        let leaf = self.sign(csr.identity(), validity, csr.public_key())?;
        let mut out = Vec::with_capacity(self.intermediates.len() + 2);
        out.push(pem::encode("CERTIFICATE", leaf.as_ref()));
        out.extend(self.intermediates.iter().map(|c| pem::encode("CERTIFICATE", c.as_ref())));
        out.push(self.roots.to_pem());
        Ok(out)
    }

    /// A serving certificate for DNS names (the control plane's own TLS
    /// listener): leaf and intermediates, and its key. EKU serverAuth only.
    pub fn issue_server_cert(
        &self,
        dns_names: &[&str],
        validity: Duration,
    ) -> Result<(Vec<CertificateDer<'static>>, WorkloadKey), CertError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let (not_before, not_after) = self.window_for(validity)?;
        let mut params = CertificateParams::new(dns_names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name = DistinguishedName::new();
        if let Some(first) = dns_names.first() {
            params.distinguished_name.push(DnType::CommonName, *first);
        }
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial());
        params.not_before = to_offset(not_before);
        params.not_after = to_offset(not_after);
        let cert = params.signed_by(&key, &self.issuer, &self.issuer_key)?;
        let mut chain = vec![cert.der().clone()];
        chain.extend(self.intermediates.iter().cloned());
        Ok((chain, WorkloadKey::from_pkcs8(key.serialize_der())))
    }

    /// The intermediates between an issued leaf and the roots, issuer first
    /// (empty when the signing certificate is a root).
    pub fn intermediates(&self) -> &[CertificateDer<'static>] {
        &self.intermediates
    }

    /// The signing certificate.
    pub fn issuer_cert(&self) -> &CertificateDer<'static> {
        &self.issuer_der
    }

    fn window_for(&self, validity: Duration) -> Result<(SystemTime, SystemTime), CertError> {
        if validity.is_zero() {
            return Err(CertError::Validity("a certificate needs a non-zero lifetime".into()));
        }
        leaf_window(SystemTime::now(), validity, self.window.0, self.chain_not_after)
            .ok_or_else(|| CertError::Validity(format!("the CA expired at {}", x509::format_time(self.chain_not_after))))
    }

    fn sign(&self, id: &SpiffeId, validity: Duration, public_key: &impl PublicKeyData) -> Result<CertificateDer<'static>, CertError> {
        let (not_before, not_after) = self.window_for(validity)?;
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
        params.not_before = to_offset(not_before);
        params.not_after = to_offset(not_after);
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
            crate::crypto::provider().signature_verification_algorithms.all,
        )
        .map_err(|e| CertError::Chain(e.to_string()))
    }
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("intermediates", &self.intermediates.len()).field("roots", &self.roots).finish_non_exhaustive()
    }
}

/// notBefore and notAfter of a certificate issued at `now` for `validity`
/// by a CA valid from `ca_not_before` to `ca_not_after`: never outside the
/// CA's window (a peer would refuse the chain), None when the CA has expired.
fn leaf_window(
    now: SystemTime,
    validity: Duration,
    ca_not_before: SystemTime,
    ca_not_after: SystemTime,
) -> Option<(SystemTime, SystemTime)> {
    // Backdate for clock skew, but never by more than a tenth of the
    // lifetime: with very short lifetimes (tests, aggressive rotation) a
    // full allowance would put the half-life renewal point in the past.
    let backdate = CLOCK_SKEW_ALLOWANCE.min(validity / 10);
    let not_before = (now - backdate).max(ca_not_before);
    let not_after = (now + validity).min(ca_not_after);
    // X.509 times are whole seconds: keep at least one.
    (not_after >= not_before + Duration::from_secs(1) && not_after > now).then_some((not_before, not_after))
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

#[cfg(test)]
mod tests {
    use super::*;

    const H: Duration = Duration::from_secs(3600);

    /// A self-signed CA valid from `now + from` to `now + to` (seconds, may be negative).
    fn ca_pem(from: i64, to: i64) -> (String, String) {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, "test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now + time::Duration::seconds(from);
        params.not_after = now + time::Duration::seconds(to);
        (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    #[test]
    fn validity_decision() {
        let now = SystemTime::UNIX_EPOCH + 1000 * H;
        let cases: &[(i64, i64, Duration, Option<CaValidityProblem>)] = &[
            (-10, 10, Duration::ZERO, None),
            (-10, 30, 24 * H, None),
            (1, 30, Duration::ZERO, Some(CaValidityProblem::NotYetValid)),
            (-30, -1, Duration::ZERO, Some(CaValidityProblem::Expired)),
            (-30, 0, Duration::ZERO, Some(CaValidityProblem::Expired)),
            (-30, 2, 24 * H, Some(CaValidityProblem::ExpiresSoon { left: 2 * H, needed: 24 * H })),
            (-30, 24, 24 * H, None),
        ];
        for (from, to, needed, want) in cases {
            let at = |h: i64| if h >= 0 { now + H * h as u32 } else { now - H * (-h) as u32 };
            assert_eq!(&ca_validity_problem(at(*from), at(*to), now, *needed), want, "CA from {from} h to {to} h, needing {needed:?}");
        }
    }

    #[test]
    fn leaf_window_never_leaves_the_ca_window() {
        let now = SystemTime::UNIX_EPOCH + 1000 * H;
        // Plenty of CA left: now - skew .. now + validity.
        assert_eq!(leaf_window(now, 24 * H, now - 100 * H, now + 100 * H), Some((now - CLOCK_SKEW_ALLOWANCE, now + 24 * H)));
        // CA ends in 2 h: the leaf ends with it.
        assert_eq!(leaf_window(now, 24 * H, now - 100 * H, now + 2 * H), Some((now - CLOCK_SKEW_ALLOWANCE, now + 2 * H)));
        // CA started 10 s ago: the leaf does not start before it.
        let start = now - Duration::from_secs(10);
        assert_eq!(leaf_window(now, 24 * H, start, now + 100 * H), Some((start, now + 24 * H)));
        // Expired CA: nothing to issue.
        assert_eq!(leaf_window(now, 24 * H, now - 100 * H, now), None);
        assert_eq!(leaf_window(now, 24 * H, now - 100 * H, now - H), None);
    }

    #[test]
    fn expired_and_future_cas_are_refused_with_their_window() {
        let (c, k) = ca_pem(-48 * 3600, -3600);
        let e = Ca::from_pem(&c, &k, None).unwrap_err();
        assert!(matches!(e, CertError::CaValidity { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.starts_with("the CA certificate has expired (valid from "), "{msg}");
        assert!(msg.contains(" UTC to ") && msg.contains("; now "), "{msg}");

        let (c, k) = ca_pem(3600, 48 * 3600);
        let msg = Ca::from_pem(&c, &k, None).unwrap_err().to_string();
        assert!(msg.contains("is not valid yet"), "{msg}");

        let dir = tempfile::tempdir().unwrap();
        let (c, k) = ca_pem(-48 * 3600, -3600);
        std::fs::write(dir.path().join("ca.pem"), c).unwrap();
        std::fs::write(dir.path().join("ca.key"), k).unwrap();
        let msg = Ca::from_pem_files(&dir.path().join("ca.pem"), &dir.path().join("ca.key"), None).unwrap_err().to_string();
        assert!(msg.contains(&format!("the CA certificate {} has expired", dir.path().join("ca.pem").display())), "{msg}");
    }

    #[test]
    fn a_ca_ending_soon_loads_but_fails_the_lifetime_check_and_clamps_what_it_issues() {
        let (c, k) = ca_pem(-3600, 2 * 3600);
        let ca = Ca::from_pem(&c, &k, None).unwrap();
        let msg = ca.check_lifetime(DEFAULT_WORKLOAD_VALIDITY).unwrap_err().to_string();
        assert!(
            msg.contains("the CA certificate expires in ") && msg.contains(" min, within the 24 h lifetime of a workload certificate"),
            "{msg}"
        );
        assert!(ca.check_lifetime(Duration::from_secs(600)).is_ok());

        let id = SpiffeId::new("cluster.local", "default", "web").unwrap();
        let leaf = ca.issue(&id, DEFAULT_WORKLOAD_VALIDITY).unwrap();
        assert_eq!(leaf.not_after(), ca.validity().1, "clamped to the CA's notAfter");
        assert!(leaf.not_before() >= ca.validity().0);
        // Renewal at half of the lifetime it really has, not of the 24 h asked.
        let lifetime = leaf.not_after().duration_since(leaf.not_before()).unwrap();
        assert!(lifetime < 3 * H, "{lifetime:?}");
        assert_eq!(leaf.renew_at(), leaf.not_before() + lifetime / 2);
        // The CSR path clamps too.
        let (csr, _key) = crate::generate_csr(&id).unwrap();
        let chain = ca.sign_csr(&csr, DEFAULT_WORKLOAD_VALIDITY, &id).unwrap();
        let der = crate::pem::certs(&chain[0], "leaf").unwrap();
        assert_eq!(x509::validity(&der[0]).unwrap().1, ca.validity().1);
    }

    #[test]
    fn server_certificates_carry_dns_names_and_chain_to_the_roots() {
        let ca = Ca::generate(&TrustDomain::default()).unwrap();
        let (chain, _key) = ca.issue_server_cert(&["istiod.istio-system.svc", "127.0.0.1"], H).unwrap();
        let leaf = ParsedCertificate::try_from(&chain[0]).unwrap();
        let verify = |name: &str| {
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &leaf,
                &ca.roots().root_store(),
                &chain[1..],
                UnixTime::now(),
                crate::crypto::provider().signature_verification_algorithms.all,
            )
            .and_then(|_| rustls::client::verify_server_name(&leaf, &rustls_pki_types::ServerName::try_from(name.to_string()).unwrap()))
        };
        verify("istiod.istio-system.svc").unwrap();
        verify("127.0.0.1").unwrap();
        assert!(verify("other.istio-system.svc").is_err());
        assert!(ca.issue_server_cert(&["x"], Duration::ZERO).is_err());
    }

    #[test]
    fn a_long_lived_ca_issues_the_full_lifetime() {
        let ca = Ca::generate(&TrustDomain::default()).unwrap();
        let id = SpiffeId::new("cluster.local", "default", "web").unwrap();
        let leaf = ca.issue(&id, DEFAULT_WORKLOAD_VALIDITY).unwrap();
        let lifetime = leaf.not_after().duration_since(leaf.not_before()).unwrap();
        assert_eq!(lifetime, DEFAULT_WORKLOAD_VALIDITY + CLOCK_SKEW_ALLOWANCE);
        assert!(ca.check_lifetime(DEFAULT_WORKLOAD_VALIDITY).is_ok());
    }
}
