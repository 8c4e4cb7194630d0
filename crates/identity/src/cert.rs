//! Workload certificates (X.509 SVIDs with their key) and trust bundles.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::error::CertError;
use crate::pem;
use crate::spiffe::SpiffeId;
use crate::x509;

/// A set of trusted roots. Several concatenated PEM roots are all trusted
/// (root rotation, or joining meshes).
#[derive(Clone)]
pub struct TrustBundle {
    certs: Arc<[CertificateDer<'static>]>,
    store: Arc<RootCertStore>,
    /// The client-certificate verifier over these roots, built at the first
    /// handshake that needs it and shared by every clone.
    client_verifier: Arc<OnceLock<Arc<dyn ClientCertVerifier>>>,
}

impl TrustBundle {
    pub fn from_der(certs: Vec<CertificateDer<'static>>) -> Result<Self, CertError> {
        if certs.is_empty() {
            return Err(CertError::PemMissing { what: "root bundle", label: "CERTIFICATE" });
        }
        let mut store = RootCertStore::empty();
        for (i, cert) in certs.iter().enumerate() {
            store.add(cert.clone()).map_err(|e| CertError::X509(format!("root {i} of the bundle: {e}")))?;
        }
        Ok(Self { certs: certs.into(), store: Arc::new(store), client_verifier: Arc::default() })
    }

    pub fn from_pem(pem: &str) -> Result<Self, CertError> {
        Self::from_der(pem::certs(pem, "root bundle")?)
    }

    pub fn from_pem_file(path: &Path) -> Result<Self, CertError> {
        Self::from_pem(&pem::read_file(path)?)
    }

    pub fn certs(&self) -> &[CertificateDer<'static>] {
        &self.certs
    }

    pub fn root_store(&self) -> Arc<RootCertStore> {
        self.store.clone()
    }

    /// All roots, concatenated (the last element of an Istio `cert_chain`).
    pub fn to_pem(&self) -> String {
        pem::encode_certs(self.certs.iter())
    }

    pub(crate) fn contains(&self, cert: &CertificateDer<'_>) -> bool {
        self.certs.iter().any(|c| c.as_ref() == cert.as_ref())
    }

    /// webpki's client verification over these roots (chain, EKU clientAuth).
    pub(crate) fn client_verifier(&self) -> Result<Arc<dyn ClientCertVerifier>, rustls::server::VerifierBuilderError> {
        if let Some(v) = self.client_verifier.get() {
            return Ok(v.clone());
        }
        let built = WebPkiClientVerifier::builder_with_provider(self.store.clone(), crate::crypto::provider()).build()?;
        Ok(self.client_verifier.get_or_init(|| built).clone())
    }
}

/// Two bundles are equal when they hold the same roots in the same order.
impl PartialEq for TrustBundle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.certs, &other.certs) || self.certs == other.certs
    }
}

impl Eq for TrustBundle {}

/// The roots a node proxy trusts now, shared by every TLS configuration it
/// makes and replaced as a whole when the CA hands out a different bundle
/// (a root rotation). Each handshake reads the bundle current at its start:
/// new connections follow a change at once, established ones are untouched.
#[derive(Clone)]
pub struct SharedTrust(Arc<ArcSwap<TrustBundle>>);

impl SharedTrust {
    pub fn new(bundle: TrustBundle) -> Self {
        Self(Arc::new(ArcSwap::from_pointee(bundle)))
    }

    /// The bundle in force (a cheap clone).
    pub fn current(&self) -> TrustBundle {
        TrustBundle::clone(&self.0.load())
    }

    /// Makes `bundle` the one in force. False when it already was.
    pub fn replace(&self, bundle: &TrustBundle) -> bool {
        if **self.0.load() == *bundle {
            return false;
        }
        self.0.store(Arc::new(bundle.clone()));
        true
    }
}

impl fmt::Debug for SharedTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SharedTrust").field(&**self.0.load()).finish()
    }
}

impl fmt::Debug for TrustBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrustBundle").field("roots", &self.certs.len()).finish()
    }
}

/// A workload private key (PKCS#8). Its `Debug` never prints the key.
pub struct WorkloadKey(PrivatePkcs8KeyDer<'static>);

impl WorkloadKey {
    pub(crate) fn from_pkcs8(der: Vec<u8>) -> Self {
        Self(PrivatePkcs8KeyDer::from(der))
    }

    pub fn from_pem(pem_text: &str) -> Result<Self, CertError> {
        match pem::private_key(pem_text, "workload key")? {
            PrivateKeyDer::Pkcs8(k) => Ok(Self(k)),
            _ => Err(CertError::Key("workload keys must be PKCS#8".into())),
        }
    }

    pub fn to_pem(&self) -> String {
        pem::encode("PRIVATE KEY", self.0.secret_pkcs8_der())
    }

    pub fn to_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.0.clone_key())
    }
}

impl Clone for WorkloadKey {
    fn clone(&self) -> Self {
        Self(self.0.clone_key())
    }
}

impl fmt::Debug for WorkloadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WorkloadKey(<redacted>)")
    }
}

/// A workload's certificate chain, its key and the roots that issued it.
///
/// `chain` is what the workload presents in TLS: leaf first, then
/// intermediates. The roots travel separately (Istio puts them last in
/// `cert_chain`); presenting them would only waste bytes.
#[derive(Clone)]
pub struct WorkloadCert {
    identity: SpiffeId,
    chain: Vec<CertificateDer<'static>>,
    roots: TrustBundle,
    key: WorkloadKey,
    not_before: SystemTime,
    not_after: SystemTime,
    serial: String,
    certified_key: Arc<CertifiedKey>,
}

impl WorkloadCert {
    /// Builds a workload certificate, checking that the leaf carries exactly
    /// one URI SAN that is a SPIFFE ID and that the key matches it.
    pub fn new(chain: Vec<CertificateDer<'static>>, roots: TrustBundle, key: WorkloadKey) -> Result<Self, CertError> {
        let leaf = chain.first().ok_or(CertError::IncompleteChain)?;
        let info = x509::leaf_info(leaf)?;
        let identity = match info.uri_sans.as_slice() {
            [uri] => uri.parse::<SpiffeId>().map_err(|e| CertError::LeafIdentity(e.to_string()))?,
            other => return Err(CertError::LeafIdentity(format!("the leaf must carry exactly one URI SAN, it has {other:?}"))),
        };
        if info.not_after <= info.not_before {
            return Err(CertError::Validity("notAfter is not after notBefore".into()));
        }
        let certified_key = CertifiedKey::from_der(chain.clone(), key.to_der(), &crate::crypto::provider()).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => CertError::KeyMismatch,
            other => CertError::Tls(other),
        })?;
        Ok(Self {
            identity,
            chain,
            roots,
            key,
            not_before: info.not_before,
            not_after: info.not_after,
            serial: info.serial,
            certified_key: Arc::new(certified_key),
        })
    }

    /// Builds a workload certificate from an Istio `IstioCertificateResponse.cert_chain`:
    /// leaf first, then intermediates, and the last element is the root
    /// bundle (possibly several concatenated roots). An element may itself
    /// hold several PEM blocks.
    pub fn from_istio_chain(cert_chain: &[String], key: WorkloadKey) -> Result<Self, CertError> {
        let (root_pem, presented) = cert_chain.split_last().ok_or(CertError::IncompleteChain)?;
        if presented.is_empty() {
            return Err(CertError::IncompleteChain);
        }
        let mut chain = Vec::new();
        for element in presented {
            chain.extend(pem::certs(element, "certificate chain")?);
        }
        let roots = TrustBundle::from_pem(root_pem)?;
        Self::new(chain, roots, key)
    }

    /// The Istio response shape: leaf, intermediates, root bundle last.
    pub fn to_istio_chain(&self) -> Vec<String> {
        self.chain.iter().map(|c| pem::encode("CERTIFICATE", c.as_ref())).chain(std::iter::once(self.roots.to_pem())).collect()
    }

    pub fn identity(&self) -> &SpiffeId {
        &self.identity
    }

    /// Leaf first, then intermediates: what is presented in TLS.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    pub fn leaf(&self) -> &CertificateDer<'static> {
        &self.chain[0]
    }

    pub fn roots(&self) -> &TrustBundle {
        &self.roots
    }

    /// Checks that the chain leads from the leaf to one of its roots, as a
    /// TLS peer would (signatures, validity now, EKU).
    pub fn verify_chain(&self) -> Result<(), CertError> {
        let leaf = rustls::server::ParsedCertificate::try_from(self.leaf()).map_err(|e| CertError::Chain(e.to_string()))?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &leaf,
            &self.roots.root_store(),
            &self.chain[1..],
            rustls_pki_types::UnixTime::now(),
            crate::crypto::provider().signature_verification_algorithms.all,
        )
        .map_err(|e| CertError::Chain(e.to_string()))
    }

    /// The same certificate, checked against `roots` from now on (a node
    /// proxy trusts one bundle for all its identities; see [`SharedTrust`]).
    pub fn with_roots(&self, roots: TrustBundle) -> WorkloadCert {
        WorkloadCert { roots, ..self.clone() }
    }

    pub fn key(&self) -> &WorkloadKey {
        &self.key
    }

    pub fn not_before(&self) -> SystemTime {
        self.not_before
    }

    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// Serial number in lower-case hex.
    pub fn serial(&self) -> &str {
        &self.serial
    }

    /// When the certificate should be replaced: at half of its lifetime, as
    /// Istio and ztunnel do.
    pub fn renew_at(&self) -> SystemTime {
        let lifetime = self.not_after.duration_since(self.not_before).unwrap_or_default();
        self.not_before + lifetime / 2
    }

    pub fn should_renew(&self, now: SystemTime) -> bool {
        now >= self.renew_at()
    }

    pub fn is_expired(&self, now: SystemTime) -> bool {
        now >= self.not_after
    }

    /// The chain and key in the form rustls signs with; parsed once.
    pub(crate) fn certified_key(&self) -> Arc<CertifiedKey> {
        self.certified_key.clone()
    }
}

impl fmt::Debug for WorkloadCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkloadCert")
            .field("identity", &self.identity)
            .field("serial", &self.serial)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .field("chain_len", &self.chain.len())
            .finish_non_exhaustive()
    }
}
