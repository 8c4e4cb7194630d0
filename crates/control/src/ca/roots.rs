//! The CA material: the signing certificate and key, the intermediates up
//! to the operator's root, and the bundle of every root the mesh trusts.
//!
//! Brought by the operator (`--ca-cert`, `--ca-key`, `--ca-chain`,
//! `--root-bundle`) or generated on first start and kept in a directory
//! (`root-cert.pem`, `root-key.pem` readable by its owner only). Material
//! that is not valid now, or that ends within a workload certificate's
//! lifetime, is refused with the file named. The files are read again on
//! SIGHUP and whenever their contents change: a root rotation is the
//! operator replacing the bundle (old and new roots), then the signing
//! certificate and key (docs/control-plane.md, "Certificates").

use super::load::{load_texts, CaTexts, Part};
use anyhow::Context;
use arc_swap::ArcSwap;
use slipstream_core::sync::LockExt;
use slipstream_core::TrustDomain;
use slipstream_identity::{format_time, Ca, TrustBundle};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The operator's CA files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaFiles {
    /// The signing certificate (PEM; may be followed by its intermediates).
    pub cert: PathBuf,
    /// Its private key (PEM, PKCS#8 or SEC1).
    pub key: PathBuf,
    /// Intermediates between the signing certificate and the operator's
    /// root, issuer first; may end with the root itself.
    pub chain: Option<PathBuf>,
    /// Every root to trust (several concatenated PEM roots: old and new
    /// during a rotation). Without it: the root that ends `chain`, or the
    /// signing certificate itself when it is a root.
    pub root_bundle: Option<PathBuf>,
}

/// Where the CA material comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaSource {
    Files(CaFiles),
    /// Generated on first start and kept in this directory.
    Generated {
        dir: PathBuf,
    },
}

/// The names a generated CA is kept under (the local cluster's too).
pub const GENERATED_CERT: &str = "root-cert.pem";
pub const GENERATED_KEY: &str = "root-key.pem";

impl CaSource {
    /// The files the material is read from, for reloads.
    fn files(&self) -> CaFiles {
        match self {
            CaSource::Files(f) => f.clone(),
            CaSource::Generated { dir } => {
                CaFiles { cert: dir.join(GENERATED_CERT), key: dir.join(GENERATED_KEY), chain: None, root_bundle: None }
            }
        }
    }
}

/// The CA in force, replaced as a whole on reload. Clones share it.
#[derive(Clone)]
pub struct CaMaterial {
    current: Arc<ArcSwap<Ca>>,
    reload: Option<Arc<Reloader>>,
}

struct Reloader {
    files: CaFiles,
    /// How long the material must still be valid (the longest workload
    /// certificate the service issues).
    needed: Duration,
    /// What the files held when last read.
    last: Mutex<Seen>,
}

/// The files' contents last read, and whether they were refused (and
/// when): refused bytes are not tried, nor complained about, again at
/// every check, but on SIGHUP and every [`RETRY_REFUSED`] (a certificate
/// that is not valid yet may become so).
struct Seen {
    bytes: Vec<u8>,
    refused_at: Option<std::time::Instant>,
}

/// How often the same refused material is tried again without a SIGHUP.
const RETRY_REFUSED: Duration = Duration::from_secs(300);

impl std::fmt::Debug for CaMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaMaterial").field("ca", &*self.current.load()).field("files", &self.reload.as_ref().map(|r| &r.files)).finish()
    }
}

impl From<Arc<Ca>> for CaMaterial {
    /// A CA that never changes.
    fn from(ca: Arc<Ca>) -> CaMaterial {
        CaMaterial { current: Arc::new(ArcSwap::new(ca)), reload: None }
    }
}

impl CaMaterial {
    /// A CA that never changes (tests, embedding).
    pub fn fixed(ca: Ca) -> CaMaterial {
        CaMaterial { current: Arc::new(ArcSwap::from_pointee(ca)), reload: None }
    }

    /// Loads (or first generates) the material. `needed`: how long it must
    /// still be valid, the service's longest certificate lifetime.
    pub fn load(source: &CaSource, trust_domain: &TrustDomain, needed: Duration) -> anyhow::Result<CaMaterial> {
        if let CaSource::Generated { dir } = source {
            generate_if_absent(dir, trust_domain)?;
        }
        let files = source.files();
        let (bytes, ca) = read_and_load(&files, needed)?;
        describe("CA loaded", &ca, &files);
        Ok(CaMaterial {
            current: Arc::new(ArcSwap::from_pointee(ca)),
            reload: Some(Arc::new(Reloader { files, needed, last: Mutex::new(Seen { bytes, refused_at: None }) })),
        })
    }

    /// Puts `ca` in force, as a reload would (tests of what follows it).
    #[cfg(test)]
    pub(crate) fn replace(&self, ca: Ca) {
        self.current.store(Arc::new(ca));
    }

    /// The CA to sign with now.
    pub fn current(&self) -> Arc<Ca> {
        self.current.load_full()
    }

    /// The roots every proxy must trust now.
    pub fn roots(&self) -> TrustBundle {
        self.current.load().roots().clone()
    }

    /// Reads the files again. Ok(true): different material was loaded and
    /// is in force; Ok(false): nothing changed (or the same contents were
    /// refused a moment ago); Err: the new contents were refused and the
    /// previous material stays in force.
    pub fn reload(&self) -> anyhow::Result<bool> {
        self.reload_with(false)
    }

    /// As [`CaMaterial::reload`], and contents refused before are tried
    /// again (the operator asked: SIGHUP).
    pub fn reload_forced(&self) -> anyhow::Result<bool> {
        self.reload_with(true)
    }

    fn reload_with(&self, force: bool) -> anyhow::Result<bool> {
        let Some(r) = &self.reload else { return Ok(false) };
        let bytes = read_all(&r.files)?;
        let now = std::time::Instant::now();
        let mut last = r.last.locked();
        if last.bytes == bytes {
            let retry = last.refused_at.is_some_and(|t| force || now.duration_since(t) >= RETRY_REFUSED);
            if !retry {
                return Ok(false);
            }
        }
        last.bytes = bytes;
        match read_and_load(&r.files, r.needed) {
            Ok((_, ca)) => {
                last.refused_at = None;
                let before = self.current();
                describe_change(&before, &ca);
                self.current.store(Arc::new(ca));
                Ok(true)
            }
            Err(e) => {
                last.refused_at = Some(now);
                Err(e.context("the new CA material was refused; the previous one stays in force"))
            }
        }
    }

    /// Reloads on SIGHUP and when the files' contents change (checked every
    /// `every`); warns while the material in force nears its end. Runs
    /// until the runtime stops.
    pub fn watch(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!("cannot watch SIGHUP ({e}); the CA files are still checked every {every:?}");
                    None
                }
            };
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut warned_at: Option<tokio::time::Instant> = None;
            loop {
                let forced = tokio::select! {
                    _ = tick.tick() => false,
                    Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => {
                        tracing::info!("SIGHUP: reading the CA files again");
                        true
                    }
                };
                match this.reload_with(forced) {
                    Ok(_) => {}
                    Err(e) => tracing::error!("{e:#}"),
                }
                if let Some(r) = &this.reload {
                    if let Err(e) = this.current().check_lifetime(r.needed) {
                        let due = warned_at.is_none_or(|t| t.elapsed() >= Duration::from_secs(3600));
                        if due {
                            tracing::warn!("{e}: replace the CA material (docs/control-plane.md, \"Certificates\")");
                            warned_at = Some(tokio::time::Instant::now());
                        }
                    }
                }
            }
        })
    }
}

fn read(path: &Path, flag: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {flag} {}", path.display()))
}

/// Every file's bytes, in a fixed order, to tell whether anything changed.
fn read_all(files: &CaFiles) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    for (p, flag) in [
        (Some(&files.cert), "--ca-cert"),
        (Some(&files.key), "--ca-key"),
        (files.chain.as_ref(), "--ca-chain"),
        (files.root_bundle.as_ref(), "--root-bundle"),
    ] {
        if let Some(p) = p {
            out.extend_from_slice(read(p, flag)?.as_bytes());
        }
        out.push(0);
    }
    Ok(out)
}

fn read_and_load(files: &CaFiles, needed: Duration) -> anyhow::Result<(Vec<u8>, Ca)> {
    let bytes = read_all(files)?;
    let ca = load_files(files, needed)?;
    Ok((bytes, ca))
}

fn load_files(files: &CaFiles, needed: Duration) -> anyhow::Result<Ca> {
    let part = |path: &Path, flag: &str| -> anyhow::Result<Part> {
        Ok(Part { text: read(path, flag)?, what: flag.to_string(), place: path.display().to_string() })
    };
    let cert = part(&files.cert, "--ca-cert")?;
    let key = part(&files.key, "--ca-key")?;
    let chain = files.chain.as_deref().map(|p| part(p, "--ca-chain")).transpose()?;
    let root_bundle = files.root_bundle.as_deref().map(|p| part(p, "--root-bundle")).transpose()?;
    let named = |flag: &str, p: &Option<PathBuf>| p.as_ref().map(|p| format!(", {flag} {}", p.display())).unwrap_or_default();
    let origin = format!(
        "loading the CA from --ca-cert {}, --ca-key {}{}{}",
        files.cert.display(),
        files.key.display(),
        named("--ca-chain", &files.chain),
        named("--root-bundle", &files.root_bundle)
    );
    load_texts(&CaTexts { cert, key, chain, root_bundle, bundle_hint: "--root-bundle".into(), origin }, needed)
}

/// Generates a root in `dir` unless one is there. Two replicas starting at
/// once with the same directory end up with the same root: the key is
/// claimed with an atomic link that fails if one already exists, and the
/// loser waits for the winner's certificate.
fn generate_if_absent(dir: &Path, trust_domain: &TrustDomain) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let cert = dir.join(GENERATED_CERT);
    let key = dir.join(GENERATED_KEY);
    if key.exists() {
        return wait_for_cert(&cert, &key);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating the CA directory {}", dir.display()))?;
    let ca = Ca::generate(trust_domain)?;
    let tmp_key = dir.join(format!(".{GENERATED_KEY}.{}", std::process::id()));
    let tmp_cert = dir.join(format!(".{GENERATED_CERT}.{}", std::process::id()));
    let write = |path: &Path, mode: u32, text: &str| -> anyhow::Result<()> {
        use std::io::Write;
        let _ = std::fs::remove_file(path);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .with_context(|| format!("creating {}", path.display()))?;
        f.write_all(text.as_bytes()).and_then(|_| f.sync_all()).with_context(|| format!("writing {}", path.display()))
    };
    write(&tmp_key, 0o600, &ca.key_pem())?;
    write(&tmp_cert, 0o644, &ca.cert_pem())?;
    let claimed = std::fs::hard_link(&tmp_key, &key);
    let _ = std::fs::remove_file(&tmp_key);
    match claimed {
        Ok(()) => {
            std::fs::rename(&tmp_cert, &cert).with_context(|| format!("writing {}", cert.display()))?;
            tracing::info!(dir = %dir.display(), "generated the mesh root CA (key readable by its owner only)");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let _ = std::fs::remove_file(&tmp_cert);
            wait_for_cert(&cert, &key)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp_cert);
            Err(e).with_context(|| format!("writing {}", key.display()))
        }
    }
}

/// A key without its certificate: another replica is writing it.
fn wait_for_cert(cert: &Path, key: &Path) -> anyhow::Result<()> {
    for _ in 0..50 {
        if cert.exists() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    anyhow::bail!(
        "{} exists but {} does not: remove the key to generate a new CA, or put its certificate there",
        key.display(),
        cert.display()
    )
}

fn summary(ca: &Ca) -> (String, usize, String) {
    let serial = x509_parser::prelude::FromDer::from_der(ca.issuer_cert().as_ref())
        .map(|(_, c): (_, x509_parser::certificate::X509Certificate<'_>)| c.raw_serial_as_string())
        .unwrap_or_default();
    (serial, ca.roots().certs().len(), format_time(ca.not_after()))
}

fn describe(what: &str, ca: &Ca, files: &CaFiles) {
    let (serial, roots, until) = summary(ca);
    tracing::info!(
        cert = %files.cert.display(),
        serial,
        intermediates = ca.intermediates().len(),
        roots,
        signs_until = until,
        "{what}"
    );
}

fn describe_change(before: &Ca, after: &Ca) {
    let (s0, r0, _) = summary(before);
    let (s1, r1, until) = summary(after);
    let roots_changed = before.roots() != after.roots();
    tracing::info!(
        serial = s1,
        previous_serial = s0,
        roots = r1,
        previous_roots = r0,
        roots_changed,
        signs_until = until,
        "CA reloaded: new certificates are signed with it; proxies take the root bundle with their next certificate"
    );
}

#[cfg(test)]
mod tests;
