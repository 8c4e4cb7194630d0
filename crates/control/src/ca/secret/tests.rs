use super::*;
use crate::ca::load::load_texts;

fn data(pairs: &[(&str, String)]) -> BTreeMap<String, ByteString> {
    pairs.iter().map(|(k, v)| (k.to_string(), ByteString(v.clone().into_bytes()))).collect()
}

fn secret() -> NamespacedName {
    NamespacedName::new("slipstream-system", "slipstream-ca")
}

fn needed() -> Duration {
    Duration::from_secs(24 * 3600)
}

#[test]
fn a_generated_root_reads_back() {
    let ca = Ca::generate(&TrustDomain::default()).unwrap();
    let texts = texts_of(&generated_data(&ca), &secret()).unwrap();
    let loaded = load_texts(&texts, needed()).unwrap();
    assert_eq!(loaded.roots(), ca.roots());
    assert_eq!(loaded.cert_pem(), ca.cert_pem());
}

#[test]
fn istios_cacerts_layout_with_the_signing_cert_in_the_chain() {
    let root = Ca::generate(&TrustDomain::default()).unwrap();
    // A self-signed root as ca-cert.pem, with cert-chain.pem repeating it
    // (as Istio's tools write it): the repeat is no intermediate.
    let d = data(&[(CA_CERT, root.cert_pem()), (CA_KEY, root.key_pem()), (CERT_CHAIN, root.cert_pem()), (ROOT_CERT, root.cert_pem())]);
    let texts = texts_of(&d, &secret()).unwrap();
    assert!(texts.chain.is_none(), "the signing certificate is not its own intermediate");
    let loaded = load_texts(&texts, needed()).unwrap();
    assert!(loaded.intermediates().is_empty());
    assert_eq!(loaded.roots(), root.roots());
}

#[test]
fn a_malformed_secret_is_refused_naming_it_and_the_key() {
    let ca = Ca::generate(&TrustDomain::default()).unwrap();
    let other = Ca::generate(&TrustDomain::default()).unwrap();
    let refusal = |d: BTreeMap<String, ByteString>| -> String {
        match texts_of(&d, &secret()).and_then(|t| load_texts(&t, needed())) {
            Ok(_) => panic!("accepted"),
            Err(e) => format!("{e:#}"),
        }
    };
    let missing = refusal(data(&[(CA_CERT, ca.cert_pem())]));
    assert!(missing.contains("Secret slipstream-system/slipstream-ca has no key ca-key.pem (it holds: ca-cert.pem)"), "{missing}");
    assert!(missing.contains("it is not changed"), "{missing}");

    let bad_pem = refusal(data(&[(CA_CERT, "-----BEGIN CERTIFICATE-----\nnot base64!\n".into()), (CA_KEY, ca.key_pem())]));
    assert!(bad_pem.contains("ca-cert.pem of Secret slipstream-system/slipstream-ca"), "{bad_pem}");

    let no_cert = refusal(data(&[(CA_CERT, "nothing".into()), (CA_KEY, ca.key_pem())]));
    assert!(no_cert.contains("key ca-cert.pem of Secret slipstream-system/slipstream-ca: no CERTIFICATE in it"), "{no_cert}");

    let mismatch = refusal(data(&[(CA_CERT, ca.cert_pem()), (CA_KEY, other.key_pem())]));
    assert!(mismatch.contains("loading the CA from Secret slipstream-system/slipstream-ca (keys ca-cert.pem, ca-key.pem)"), "{mismatch}");

    let binary = refusal(BTreeMap::from([(CA_CERT.to_string(), ByteString(vec![0xff, 0xfe])), (CA_KEY.to_string(), ByteString(vec![]))]));
    assert!(binary.contains("key ca-cert.pem is not PEM text"), "{binary}");
}
