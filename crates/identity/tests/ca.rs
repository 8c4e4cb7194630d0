//! The CA: issued certificate contents, CSR flow, loading operator roots.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use slipstream_core::{SpiffeId, TrustDomain};
use slipstream_identity::{generate_csr, Ca, CertError, TrustBundle, WorkloadCert, DEFAULT_WORKLOAD_VALIDITY};
use x509_parser::extensions::GeneralName;
use x509_parser::oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_SIG_ECDSA_WITH_SHA256};
use x509_parser::prelude::{FromDer, X509Certificate};

fn id(s: &str) -> SpiffeId {
    s.parse().unwrap()
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

#[test]
fn issued_certificate_has_exactly_the_svid_fields() {
    let ca = Ca::generate(&TrustDomain::default()).unwrap();
    let who = id("spiffe://cluster.local/ns/default/sa/sleep");
    let before = SystemTime::now();
    let cert = ca.issue(&who, DEFAULT_WORKLOAD_VALIDITY).unwrap();
    assert_eq!(cert.identity(), &who);
    assert_eq!(cert.chain().len(), 1, "a root-signed leaf has no intermediates");

    let (_, x) = X509Certificate::from_der(cert.leaf()).unwrap();
    // Empty subject, identity only in the SAN.
    assert_eq!(x.subject().iter().count(), 0);

    let san = x.subject_alternative_name().unwrap().expect("SAN present");
    assert!(san.critical, "SAN must be critical with an empty subject");
    assert_eq!(san.value.general_names.len(), 1);
    match &san.value.general_names[0] {
        GeneralName::URI(uri) => assert_eq!(*uri, "spiffe://cluster.local/ns/default/sa/sleep"),
        other => panic!("unexpected SAN {other:?}"),
    }

    let eku = x.extended_key_usage().unwrap().expect("EKU present").value;
    assert!(eku.server_auth && eku.client_auth);
    assert!(!eku.any && !eku.code_signing && !eku.email_protection && !eku.time_stamping);
    assert!(!eku.ocsp_signing && eku.other.is_empty());

    let ku = x.key_usage().unwrap().expect("KU present").value;
    assert!(ku.digital_signature() && ku.key_encipherment());
    assert!(!ku.key_cert_sign() && !ku.crl_sign() && !ku.non_repudiation());
    assert!(!ku.key_agreement() && !ku.data_encipherment());

    let bc = x.basic_constraints().unwrap().expect("basicConstraints present").value;
    assert!(!bc.ca);

    let spki = x.public_key();
    assert_eq!(spki.algorithm.algorithm, OID_KEY_TYPE_EC_PUBLIC_KEY);
    let curve = spki.algorithm.parameters.as_ref().unwrap().as_oid().unwrap();
    assert_eq!(curve, OID_EC_P256);
    assert_eq!(x.signature_algorithm.algorithm, OID_SIG_ECDSA_WITH_SHA256);

    let nb = x.validity().not_before.timestamp();
    let na = x.validity().not_after.timestamp();
    assert!(nb < unix(before), "not-before is in the past");
    assert!(nb >= unix(before) - 61, "but only slightly");
    let lifetime = na - unix(before);
    assert!((86_399..=86_401).contains(&lifetime), "24 h, got {lifetime}");
    assert_eq!(unix(cert.not_before()), nb);
    assert_eq!(unix(cert.not_after()), na);

    // Issued by the root, and the serial is what the cert says.
    let (_, root) = X509Certificate::from_der(&ca.roots().certs()[0]).unwrap();
    assert_eq!(x.issuer().as_raw(), root.subject().as_raw());
    assert_eq!(cert.serial(), x.raw_serial().iter().map(|b| format!("{b:02x}")).collect::<String>());
    assert!(root.is_ca());
    let root_life = root.validity().not_after.timestamp() - root.validity().not_before.timestamp();
    assert!(root_life >= 10 * 365 * 86_400);

    // Two issues never share a serial or key.
    let again = ca.issue(&who, DEFAULT_WORKLOAD_VALIDITY).unwrap();
    assert_ne!(again.serial(), cert.serial());
    assert_ne!(again.key().to_pem(), cert.key().to_pem());
    assert!(!format!("{cert:?}").contains("PRIVATE"));
}

#[test]
fn renewal_point_is_half_life() {
    let ca = Ca::generate(&TrustDomain::default()).unwrap();
    let cert = ca.issue(&id("spiffe://cluster.local/ns/a/sa/b"), Duration::from_secs(3600)).unwrap();
    let half = cert.not_before() + cert.not_after().duration_since(cert.not_before()).unwrap() / 2;
    assert_eq!(cert.renew_at(), half);
    assert!(!cert.should_renew(half - Duration::from_secs(1)));
    assert!(cert.should_renew(half));
    assert!(!cert.is_expired(half));
    assert!(cert.is_expired(cert.not_after()));
}

#[test]
fn csr_flow_returns_istio_shaped_chain() {
    let ca = Ca::generate(&TrustDomain::default()).unwrap();
    let who = id("spiffe://cluster.local/ns/default/sa/productpage");
    let (csr, key) = generate_csr(&who).unwrap();
    assert!(csr.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
    let chain = ca.sign_csr(&csr, Duration::from_secs(3600), &who).unwrap();
    assert_eq!(chain.len(), 2, "leaf, then the root bundle");
    assert_eq!(chain[1], ca.roots().to_pem());
    let cert = WorkloadCert::from_istio_chain(&chain, key).unwrap();
    assert_eq!(cert.identity(), &who);
    assert_eq!(cert.to_istio_chain(), chain);
}

#[test]
fn csr_with_another_identity_is_refused() {
    let ca = Ca::generate(&TrustDomain::default()).unwrap();
    let asked = id("spiffe://cluster.local/ns/default/sa/admin");
    let entitled = id("spiffe://cluster.local/ns/default/sa/sleep");
    let (csr, _) = generate_csr(&asked).unwrap();
    match ca.sign_csr(&csr, Duration::from_secs(3600), &entitled) {
        Err(CertError::CsrIdentity { expected, found }) => {
            assert_eq!(expected, entitled);
            assert_eq!(found, vec![asked.to_string()]);
        }
        other => panic!("expected a CsrIdentity refusal, got {other:?}"),
    }
}

#[test]
fn csr_with_extra_san_or_wrong_key_is_refused() {
    let ca = Ca::generate(&TrustDomain::default()).unwrap();
    let who = id("spiffe://cluster.local/ns/default/sa/sleep");

    // Two SANs: the right URI plus a DNS name.
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = CertificateParams::default();
    params.subject_alt_names =
        vec![rcgen::SanType::URI(who.to_string().try_into().unwrap()), rcgen::SanType::DnsName("evil.example".try_into().unwrap())];
    let csr = params.serialize_request(&key).unwrap().pem().unwrap();
    assert!(matches!(ca.sign_csr(&csr, Duration::from_secs(60), &who), Err(CertError::Csr(slipstream_identity::CsrError::OtherNames(_)))));

    // A P-384 key.
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    let mut params = CertificateParams::default();
    params.subject_alt_names = vec![rcgen::SanType::URI(who.to_string().try_into().unwrap())];
    let csr = params.serialize_request(&key).unwrap().pem().unwrap();
    assert!(matches!(ca.sign_csr(&csr, Duration::from_secs(60), &who), Err(CertError::Csr(slipstream_identity::CsrError::KeyType(_)))));

    // Garbage and a tampered signature.
    assert!(ca.sign_csr("not pem", Duration::from_secs(60), &who).is_err());
    let (good, _) = generate_csr(&who).unwrap();
    let mut tampered = good.clone();
    let pos = tampered.find("MI").unwrap() + 60;
    let c = if &tampered[pos..pos + 1] == "A" { "B" } else { "A" };
    tampered.replace_range(pos..pos + 1, c);
    assert!(ca.sign_csr(&tampered, Duration::from_secs(60), &who).is_err());
}

#[test]
fn generated_root_round_trips_through_files() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::generate(&TrustDomain::new("example.org").unwrap()).unwrap();
    let cert_path = dir.path().join("ca-cert.pem");
    let key_path = dir.path().join("ca-key.pem");
    std::fs::write(&cert_path, ca.cert_pem()).unwrap();
    std::fs::write(&key_path, ca.key_pem()).unwrap();

    let loaded = Ca::from_pem_files(&cert_path, &key_path, None).unwrap();
    assert_eq!(loaded.roots().certs(), ca.roots().certs());
    let cert = loaded.issue(&id("spiffe://example.org/ns/a/sa/b"), Duration::from_secs(600)).unwrap();
    let (_, x) = X509Certificate::from_der(cert.leaf()).unwrap();
    let (_, root) = X509Certificate::from_der(&ca.roots().certs()[0]).unwrap();
    assert_eq!(x.issuer().as_raw(), root.subject().as_raw());
    assert!(root.subject().iter_organization().any(|o| o.as_str().unwrap() == "example.org"));
}

/// An operator root that signs an intermediate; the intermediate is the
/// signing CA, and the bundle holds two roots.
#[test]
fn intermediate_ca_with_multi_root_bundle() {
    let root_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut root_params = CertificateParams::default();
    root_params.distinguished_name.push(DnType::CommonName, "operator root");
    root_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    root_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let root = root_params.self_signed(&root_key).unwrap();

    let int_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut int_params = CertificateParams::default();
    int_params.distinguished_name.push(DnType::CommonName, "operator intermediate");
    int_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    int_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    int_params.use_authority_key_identifier_extension = true;
    let intermediate = int_params.signed_by(&int_key, &root, &root_key).unwrap();

    let other_root = Ca::generate(&TrustDomain::default()).unwrap();
    let bundle = format!("{}{}", other_root.cert_pem(), root.pem());

    let ca = Ca::from_pem(&intermediate.pem(), &int_key.serialize_pem(), Some(&bundle)).unwrap();
    assert_eq!(ca.roots().certs().len(), 2);
    let who = id("spiffe://cluster.local/ns/default/sa/sleep");
    let cert = ca.issue(&who, Duration::from_secs(600)).unwrap();
    assert_eq!(cert.chain().len(), 2, "leaf then intermediate");
    assert_eq!(cert.chain()[1].as_ref(), intermediate.der().as_ref());

    let (csr, key) = generate_csr(&who).unwrap();
    let chain = ca.sign_csr(&csr, Duration::from_secs(600), &who).unwrap();
    assert_eq!(chain.len(), 3, "leaf, intermediate, root bundle");
    assert_eq!(chain[2], bundle);
    let from_chain = WorkloadCert::from_istio_chain(&chain, key).unwrap();
    assert_eq!(from_chain.roots().certs().len(), 2);

    // The bundle without the intermediate's root does not load.
    let err = Ca::from_pem(&intermediate.pem(), &int_key.serialize_pem(), Some(&other_root.cert_pem())).unwrap_err();
    assert!(matches!(err, CertError::Chain(_)), "{err}");
}

#[test]
fn bad_ca_material_is_refused_clearly() {
    let ca = Ca::generate(&TrustDomain::default()).unwrap();
    let other = Ca::generate(&TrustDomain::default()).unwrap();
    assert!(matches!(Ca::from_pem(&ca.cert_pem(), &other.key_pem(), None), Err(CertError::KeyMismatch)));
    let leaf = ca.issue(&id("spiffe://cluster.local/ns/a/sa/b"), Duration::from_secs(60)).unwrap();
    let leaf_pem = &leaf.to_istio_chain()[0];
    assert!(matches!(Ca::from_pem(leaf_pem, &leaf.key().to_pem(), Some(&ca.cert_pem())), Err(CertError::NotACa)));
    assert!(matches!(Ca::from_pem("", &ca.key_pem(), None), Err(CertError::PemMissing { .. })));
    assert!(matches!(Ca::from_pem(&ca.cert_pem(), "junk", None), Err(CertError::PemMissing { .. })));
    let missing = std::path::Path::new("/nonexistent/ca.pem");
    let err = Ca::from_pem_files(missing, missing, None).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    assert!(ca.issue(&id("spiffe://cluster.local/ns/a/sa/b"), Duration::ZERO).is_err());
}

#[test]
fn istio_chain_needs_a_root() {
    let ca = Ca::generate(&TrustDomain::default()).unwrap();
    let who = id("spiffe://cluster.local/ns/a/sa/b");
    let (csr, key) = generate_csr(&who).unwrap();
    let chain = ca.sign_csr(&csr, Duration::from_secs(60), &who).unwrap();
    assert!(matches!(WorkloadCert::from_istio_chain(&chain[..1], key.clone()), Err(CertError::IncompleteChain)));
    // The wrong key for the leaf.
    let (_, other_key) = generate_csr(&who).unwrap();
    assert!(matches!(WorkloadCert::from_istio_chain(&chain, other_key), Err(CertError::KeyMismatch)));
    let bundle = TrustBundle::from_pem(&chain[1]).unwrap();
    assert_eq!(bundle.certs().len(), 1);
}
