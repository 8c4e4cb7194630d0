use super::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use std::os::unix::fs::PermissionsExt;

const H: Duration = Duration::from_secs(3600);

/// A CA certificate valid from `now + from_h` to `now + to_h` hours,
/// self-signed or signed by `issuer`.
fn ca_cert(name: &str, from_h: i64, to_h: i64, issuer: Option<(&rcgen::Certificate, &KeyPair)>) -> (rcgen::Certificate, KeyPair) {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p = CertificateParams::default();
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let now = time_now();
    p.not_before = now + rcgen_hours(from_h);
    p.not_after = now + rcgen_hours(to_h);
    let cert = match issuer {
        Some((ic, ik)) => p.signed_by(&key, ic, ik).unwrap(),
        None => p.self_signed(&key).unwrap(),
    };
    (cert, key)
}

fn time_now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

fn rcgen_hours(h: i64) -> time::Duration {
    time::Duration::hours(h)
}

struct Dir {
    dir: tempfile::TempDir,
}

impl Dir {
    fn new() -> Dir {
        Dir { dir: tempfile::tempdir().unwrap() }
    }
    fn put(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

fn files(cert: PathBuf, key: PathBuf) -> CaFiles {
    CaFiles { cert, key, chain: None, root_bundle: None }
}

fn td() -> TrustDomain {
    TrustDomain::default()
}

#[test]
fn a_generated_root_is_kept_with_a_private_key_and_found_again() {
    let d = Dir::new();
    let dir = d.dir.path().join("ca");
    let source = CaSource::Generated { dir: dir.clone() };
    let first = CaMaterial::load(&source, &td(), 24 * H).unwrap();
    let mode = std::fs::metadata(dir.join(GENERATED_KEY)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the key is readable by its owner only");
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    let again = CaMaterial::load(&source, &td(), 24 * H).unwrap();
    assert_eq!(first.roots(), again.roots(), "the second start finds the first root");
    assert!(
        std::fs::read_dir(&dir).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().starts_with('.')),
        "no temporary files left"
    );
}

#[test]
fn a_key_without_its_certificate_is_an_error_naming_both() {
    let d = Dir::new();
    let dir = d.dir.path().to_path_buf();
    std::fs::write(dir.join(GENERATED_KEY), "x").unwrap();
    let e = CaMaterial::load(&CaSource::Generated { dir: dir.clone() }, &td(), 24 * H).unwrap_err().to_string();
    assert!(e.contains("root-key.pem exists but") && e.contains("root-cert.pem does not"), "{e}");
}

#[test]
fn material_out_of_its_window_is_refused_naming_the_file() {
    let d = Dir::new();
    for (what, from, to, needed, says) in [
        ("expired", -48, -1, Duration::ZERO, "has expired"),
        ("future", 1, 48, Duration::ZERO, "is not valid yet"),
        ("nearly expired", -48, 2, 24 * H, "within the 24 h lifetime of a workload certificate"),
    ] {
        let (c, k) = ca_cert(what, from, to, None);
        let cert = d.put(&format!("{what}.pem"), &c.pem());
        let key = d.put(&format!("{what}.key"), &k.serialize_pem());
        let e = CaMaterial::load(&CaSource::Files(files(cert.clone(), key)), &td(), needed).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains(&format!("the CA certificate {}", cert.display())) && msg.contains(says), "{what}: {msg}");
    }
}

#[test]
fn an_operator_chain_names_its_own_problems() {
    let d = Dir::new();
    let (root, root_key) = ca_cert("operator root", -24, 24 * 365, None);
    let (int, int_key) = ca_cert("intermediate", -24, 24 * 300, Some((&root, &root_key)));
    let (signing, signing_key) = ca_cert("signing", -24, 24 * 200, Some((&int, &int_key)));
    let cert = d.put("ca-cert.pem", &signing.pem());
    let key = d.put("ca-key.pem", &signing_key.serialize_pem());

    // The chain ends with the root: that root is the bundle.
    let chain = d.put("cert-chain.pem", &format!("{}{}", int.pem(), root.pem()));
    let f = CaFiles { chain: Some(chain.clone()), ..files(cert.clone(), key.clone()) };
    let m = CaMaterial::load(&CaSource::Files(f), &td(), 24 * H).unwrap();
    assert_eq!(m.current().intermediates().len(), 2, "the signing certificate, then its issuer");
    assert_eq!(m.roots().certs().len(), 1);
    assert_eq!(m.roots().certs()[0].as_ref(), root.der().as_ref());

    // Without the root and without a bundle: which root to trust?
    let no_root = d.put("int-only.pem", &int.pem());
    let f = CaFiles { chain: Some(no_root), ..files(cert.clone(), key.clone()) };
    let e = format!("{:#}", CaMaterial::load(&CaSource::Files(f), &td(), 24 * H).unwrap_err());
    assert!(e.contains("does not end with the operator's root and no --root-bundle was given"), "{e}");

    // An expired intermediate is named with its file and position.
    let (old_int, _) = ca_cert("old intermediate", -48, -1, Some((&root, &root_key)));
    let stale = d.put("stale-chain.pem", &format!("{}{}", old_int.pem(), root.pem()));
    let f = CaFiles { chain: Some(stale.clone()), root_bundle: None, ..files(cert.clone(), key.clone()) };
    let e = format!("{:#}", CaMaterial::load(&CaSource::Files(f), &td(), 24 * H).unwrap_err());
    assert!(e.contains(&format!("the intermediate (certificate 1 of 2) in --ca-chain {} has expired", stale.display())), "{e}");

    // A key that is not the certificate's names every file.
    let (_, other_key) = ca_cert("other", -1, 48, None);
    let wrong = d.put("wrong.key", &other_key.serialize_pem());
    let f = CaFiles { chain: Some(chain), ..files(cert, wrong.clone()) };
    let e = format!("{:#}", CaMaterial::load(&CaSource::Files(f), &td(), 24 * H).unwrap_err());
    assert!(e.contains(&format!("--ca-key {}", wrong.display())) && e.contains("does not belong to the certificate"), "{e}");
}

#[test]
fn reload_takes_new_bundles_and_keeps_the_old_material_on_bad_input() {
    let d = Dir::new();
    let (a, a_key) = ca_cert("root A", -1, 24 * 365, None);
    let (b, _) = ca_cert("root B", -1, 24 * 365, None);
    let cert = d.put("ca-cert.pem", &a.pem());
    let key = d.put("ca-key.pem", &a_key.serialize_pem());
    let bundle = d.put("roots.pem", &a.pem());
    let f = CaFiles { root_bundle: Some(bundle.clone()), ..files(cert, key.clone()) };
    let m = CaMaterial::load(&CaSource::Files(f), &td(), 24 * H).unwrap();
    assert!(!m.reload().unwrap(), "nothing changed");

    std::fs::write(&bundle, format!("{}{}", a.pem(), b.pem())).unwrap();
    assert!(m.reload().unwrap());
    assert_eq!(m.roots().certs().len(), 2);

    // Half-written: a key that does not match. Refused, the old stays.
    let (_, other) = ca_cert("other", -1, 48, None);
    std::fs::write(&key, other.serialize_pem()).unwrap();
    let e = format!("{:#}", m.reload().unwrap_err());
    assert!(e.starts_with("the new CA material was refused; the previous one stays in force"), "{e}");
    assert_eq!(m.roots().certs().len(), 2);
    // The same bad bytes are not tried again at every check, but are when
    // the operator asks (SIGHUP), and still refused.
    assert!(!m.reload().unwrap());
    let again = format!("{:#}", m.reload_forced().unwrap_err());
    assert!(again.starts_with("the new CA material was refused"), "{again}");
    assert!(!m.reload().unwrap());
    assert_eq!(m.roots().certs().len(), 2);
    std::fs::write(&key, a_key.serialize_pem()).unwrap();
    assert!(m.reload().unwrap());
}

#[tokio::test]
async fn watch_reloads_when_the_files_change() {
    let d = Dir::new();
    let (a, a_key) = ca_cert("root A", -1, 24 * 365, None);
    let (b, _) = ca_cert("root B", -1, 24 * 365, None);
    let bundle = d.put("roots.pem", &a.pem());
    let f = CaFiles { root_bundle: Some(bundle.clone()), ..files(d.put("c.pem", &a.pem()), d.put("k.pem", &a_key.serialize_pem())) };
    let m = CaMaterial::load(&CaSource::Files(f), &td(), 24 * H).unwrap();
    let task = m.watch(Duration::from_millis(20));
    std::fs::write(&bundle, format!("{}{}", a.pem(), b.pem())).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while m.roots().certs().len() != 2 {
        assert!(std::time::Instant::now() < deadline, "the new bundle was not picked up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task.abort();
}
