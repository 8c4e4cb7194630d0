//! The certificates and keys of one test server, all fresh per server:
//! a CA, kube-apiserver's serving certificate, the `admin` client
//! certificate, and the key that signs service-account tokens.

use std::net::{IpAddr, Ipv4Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

/// The user the kubeconfig authenticates as, and its group: `system:masters`
/// is the group RBAC lets do anything, so tests need no role bindings.
pub const ADMIN_USER: &str = "admin";
pub const ADMIN_GROUP: &str = "system:masters";

pub struct Pki {
    pub ca_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    pub admin_cert_pem: String,
    pub admin_key_pem: String,
    /// Signs service-account tokens (`--service-account-signing-key-file`).
    pub sa_key_pem: String,
    /// Verifies them (`--service-account-key-file`).
    pub sa_public_pem: String,
}

impl Pki {
    pub fn generate() -> Result<Self, rcgen::Error> {
        let ca_key = new_key()?;
        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = name("slipstream kubetest CA", None);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca = ca_params.self_signed(&ca_key)?;

        let serving_key = new_key()?;
        let mut serving = CertificateParams::default();
        serving.distinguished_name = name("kube-apiserver", None);
        // Clients dial 127.0.0.1; the in-cluster names are there for tests
        // that connect the way a pod would.
        serving.subject_alt_names = vec![SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))];
        for dns in ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"] {
            serving.subject_alt_names.push(SanType::DnsName(dns.try_into()?));
        }
        serving.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &ca, &ca_key)?;

        // kube-apiserver's x509 authenticator takes the user from CN and the
        // groups from O.
        let admin_key = new_key()?;
        let mut admin = CertificateParams::default();
        admin.distinguished_name = name(ADMIN_USER, Some(ADMIN_GROUP));
        admin.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &ca, &ca_key)?;

        // ES256: kube-apiserver signs service-account tokens with ECDSA keys
        // as well as RSA ones, and P-256 is quick to generate.
        let sa_key = new_key()?;

        Ok(Self {
            ca_pem: ca.pem(),
            serving_cert_pem: serving_cert.pem(),
            serving_key_pem: serving_key.serialize_pem(),
            admin_cert_pem: admin_cert.pem(),
            admin_key_pem: admin_key.serialize_pem(),
            sa_key_pem: sa_key.serialize_pem(),
            sa_public_pem: sa_key.public_key_pem(),
        })
    }
}

fn new_key() -> Result<KeyPair, rcgen::Error> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}
