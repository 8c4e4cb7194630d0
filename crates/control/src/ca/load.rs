//! The CA material from its texts, wherever they were read (the
//! operator's files, or a Kubernetes Secret): each piece is named as its
//! origin names it, so that an error says which file or which key of which
//! Secret is wrong.

use anyhow::Context;
use slipstream_identity::{ca_validity_problem, certificate_validity, format_time, Ca, TrustBundle};
use std::path::Path;
use std::time::{Duration, SystemTime};

/// One piece of the material: its text, and how messages name it
/// (`what place`: `--ca-cert /etc/ca/cert.pem`, or `key ca-cert.pem of
/// Secret ns/name`).
#[derive(Debug, Clone)]
pub(crate) struct Part {
    pub(crate) text: String,
    /// The flag (or "key"), as messages name it.
    pub(crate) what: String,
    /// The path (or the Secret's key and name).
    pub(crate) place: String,
}

impl Part {
    fn name(&self) -> String {
        format!("{} {}", self.what, self.place)
    }
}

/// Every piece of the CA material, as read.
#[derive(Debug, Clone)]
pub(crate) struct CaTexts {
    /// The signing certificate, optionally followed by its intermediates.
    pub(crate) cert: Part,
    /// Its private key.
    pub(crate) key: Part,
    /// Intermediates from the signing certificate's issuer up to the
    /// operator's root (which may end it).
    pub(crate) chain: Option<Part>,
    /// Every root to trust.
    pub(crate) root_bundle: Option<Part>,
    /// How the bundle is given, for the message that asks for it
    /// (`--root-bundle`, `root-cert.pem`).
    pub(crate) bundle_hint: String,
    /// Where it all came from, as the context of a refusal
    /// (`loading the CA from ...`).
    pub(crate) origin: String,
}

/// Parses PEM certificates, naming the piece on failure.
fn pem_certs(part: &Part) -> anyhow::Result<Vec<Vec<u8>>> {
    let certs: Vec<Vec<u8>> = rustls_pemfile::certs(&mut part.text.as_bytes())
        .map(|c| c.map(|c| c.as_ref().to_vec()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("{}: malformed PEM", part.name()))?;
    anyhow::ensure!(!certs.is_empty(), "{}: no CERTIFICATE in it", part.name());
    Ok(certs)
}

fn is_self_signed(der: &[u8]) -> bool {
    use x509_parser::prelude::FromDer;
    x509_parser::certificate::X509Certificate::from_der(der).is_ok_and(|(_, c)| c.subject().as_raw() == c.issuer().as_raw())
}

/// A validity problem of one certificate of the material, with the piece
/// and the certificate's position named.
fn check_window(der: &[u8], needed: Duration, what: &str) -> anyhow::Result<()> {
    let (nb, na) = certificate_validity(der).with_context(|| what.to_string())?;
    let now = SystemTime::now();
    match ca_validity_problem(nb, na, now, needed) {
        None => Ok(()),
        Some(p) => anyhow::bail!("{what} {p} (valid from {} to {}; now {})", format_time(nb), format_time(na), format_time(now)),
    }
}

/// Checks the chain's certificates; returns the operator's root if it ends
/// the chain.
fn check_chain(chain: &Part, needed: Duration) -> anyhow::Result<Option<Vec<u8>>> {
    let certs = pem_certs(chain)?;
    let mut chain_root = None;
    for (i, der) in certs.iter().enumerate() {
        if is_self_signed(der) {
            // The operator's root: it must be valid now; its end is
            // watched through the roots of the bundle.
            check_window(der, Duration::ZERO, &format!("the root (certificate {} of {}) in {}", i + 1, certs.len(), chain.name()))?;
            chain_root = Some(der.clone());
        } else {
            check_window(der, needed, &format!("the intermediate (certificate {} of {}) in {}", i + 1, certs.len(), chain.name()))?;
        }
    }
    Ok(chain_root)
}

/// Checks the bundle: at least one root in it valid now (the others are
/// warned about).
fn check_bundle(bundle: &Part) -> anyhow::Result<()> {
    let roots = pem_certs(bundle)?;
    let now = SystemTime::now();
    let mut valid = 0;
    for (i, der) in roots.iter().enumerate() {
        match certificate_validity(der).map(|(nb, na)| ca_validity_problem(nb, na, now, Duration::ZERO)) {
            Ok(None) => valid += 1,
            Ok(Some(problem)) => tracing::warn!("root {} of {} in {} {problem}: it trusts nothing", i + 1, roots.len(), bundle.name()),
            Err(e) => anyhow::bail!("root {} of {} in {}: {e}", i + 1, roots.len(), bundle.name()),
        }
    }
    anyhow::ensure!(valid > 0, "{}: every root in it has expired or is not valid yet", bundle.name());
    Ok(())
}

/// The CA from its texts: every certificate checked (valid now; the
/// signing certificate and intermediates for `needed` more), the key
/// matching the certificate, and a root the mesh can trust.
pub(crate) fn load_texts(t: &CaTexts, needed: Duration) -> anyhow::Result<Ca> {
    let signing = pem_certs(&t.cert)?;
    check_window(&signing[0], needed, &format!("the CA certificate {}", t.cert.place))?;
    let chain_root = match &t.chain {
        Some(chain) => check_chain(chain, needed)?,
        None => None,
    };
    let bundle_text = match &t.root_bundle {
        Some(b) => {
            check_bundle(b)?;
            Some(b.text.clone())
        }
        None => chain_root.map(|der| TrustBundle::from_der(vec![der.into()]).map(|b| b.to_pem())).transpose()?,
    };
    if let (Some(chain), None) = (&t.chain, &bundle_text) {
        if !is_self_signed(&signing[0]) {
            anyhow::bail!(
                "{} does not end with the operator's root and no {} was given: the mesh would not know which root to trust",
                chain.name(),
                t.bundle_hint
            );
        }
    }
    let chain_text = t.chain.as_ref().map(|c| c.text.as_str()).unwrap_or_default();
    let full_chain = format!("{}\n{chain_text}", t.cert.text);
    let ca =
        Ca::from_pem_named(&full_chain, &t.key.text, bundle_text.as_deref(), Path::new(&t.cert.place)).with_context(|| t.origin.clone())?;
    // Intermediates given after the signing certificate, and the whole
    // chain as the CA computed it.
    ca.check_lifetime(needed)?;
    Ok(ca)
}
