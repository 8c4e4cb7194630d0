//! The serving certificate of the control plane port: issued by the mesh
//! CA for DNS names (clients verify it against the mesh root and
//! `istiod.istio-system.svc`), renewed at half-life and as soon as the CA
//! material changes (a rotation: the new root may be all clients trust
//! after it), swapped in without a restart: each new TLS handshake takes
//! the current one.

use crate::ca::CaMaterial;
use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use slipstream_identity::Ca;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// After a failed renewal, try again this often (sooner if expiry is nearer).
const RETRY: Duration = Duration::from_secs(60);
/// How often the CA material is looked at for a change.
const CA_CHECK: Duration = Duration::from_secs(2);

pub struct ServingCert {
    ca: CaMaterial,
    names: Vec<String>,
    validity: Duration,
    current: ArcSwap<Issued>,
}

struct Issued {
    key: Arc<CertifiedKey>,
    /// The CA that signed it.
    by: Arc<Ca>,
    not_before: SystemTime,
    not_after: SystemTime,
}

impl std::fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self.current.load();
        f.debug_struct("ServingCert").field("names", &self.names).field("not_after", &c.not_after).finish_non_exhaustive()
    }
}

impl ServingCert {
    pub fn issue(ca: CaMaterial, names: Vec<String>, validity: Duration) -> anyhow::Result<Arc<ServingCert>> {
        anyhow::ensure!(!names.is_empty(), "the control plane's certificate needs at least one name");
        let first = issue(ca.current(), &names, validity)?;
        Ok(Arc::new(ServingCert { ca, names, validity, current: ArcSwap::from_pointee(first) }))
    }

    /// notBefore and notAfter of the certificate now served.
    pub fn validity(&self) -> (SystemTime, SystemTime) {
        let c = self.current.load();
        (c.not_before, c.not_after)
    }

    /// The chain now served, leaf first.
    pub fn chain(&self) -> Vec<rustls_pki_types::CertificateDer<'static>> {
        self.current.load().key.cert.clone()
    }

    /// Issues a new certificate now and serves it from the next handshake.
    pub fn renew(&self) -> anyhow::Result<()> {
        self.current.store(Arc::new(issue(self.ca.current(), &self.names, self.validity)?));
        Ok(())
    }

    /// Whether the certificate served was signed by the CA in force now.
    fn signed_by_current_ca(&self) -> bool {
        Arc::ptr_eq(&self.current.load().by, &self.ca.current())
    }

    /// Renews at half-life, and when the CA material changes, forever.
    pub async fn renew_loop(self: Arc<Self>) {
        loop {
            let (not_before, not_after) = self.validity();
            let half = not_after.duration_since(not_before).unwrap_or_default() / 2;
            let due = not_before + half;
            let why = loop {
                let wait = due.duration_since(SystemTime::now()).unwrap_or_default();
                if wait.is_zero() {
                    break "half its lifetime has passed";
                }
                tokio::time::sleep(wait.min(CA_CHECK)).await;
                if !self.signed_by_current_ca() {
                    break "the CA material changed";
                }
            };
            loop {
                match self.renew() {
                    Ok(()) => {
                        tracing::info!(names = ?self.names, "renewed the control plane's serving certificate: {why}");
                        break;
                    }
                    Err(e) => {
                        let left = not_after.duration_since(SystemTime::now()).unwrap_or_default();
                        tracing::error!("renewing the control plane's serving certificate (it expires in {left:?}): {e:#}");
                        tokio::time::sleep(RETRY.min(left / 2).max(Duration::from_secs(1))).await;
                    }
                }
            }
        }
    }
}

fn issue(ca: Arc<Ca>, names: &[String], validity: Duration) -> anyhow::Result<Issued> {
    use anyhow::Context;
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let (chain, key) = ca.issue_server_cert(&names, validity).context("issuing the control plane's serving certificate")?;
    let (not_before, not_after) = validity_of(&chain[0])?;
    let key = CertifiedKey::from_der(chain, key.to_der(), &slipstream_identity::tls::provider())
        .context("the control plane's serving certificate")?;
    Ok(Issued { key: Arc::new(key), by: ca, not_before, not_after })
}

fn validity_of(der: &[u8]) -> anyhow::Result<(SystemTime, SystemTime)> {
    use x509_parser::prelude::FromDer;
    let (_, cert) =
        x509_parser::certificate::X509Certificate::from_der(der).map_err(|e| anyhow::anyhow!("parsing the serving certificate: {e}"))?;
    let t = |ts: i64| SystemTime::UNIX_EPOCH + Duration::from_secs(ts.max(0) as u64);
    Ok((t(cert.validity().not_before.timestamp()), t(cert.validity().not_after.timestamp())))
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load().key.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_core::TrustDomain;

    #[tokio::test(start_paused = true)]
    async fn a_new_ca_gets_a_new_serving_certificate_within_seconds() {
        let material = CaMaterial::fixed(Ca::generate(&TrustDomain::default()).unwrap());
        let cert = ServingCert::issue(material.clone(), vec!["istiod.istio-system.svc".into()], Duration::from_secs(24 * 3600)).unwrap();
        let first = cert.chain();
        let task = tokio::spawn(cert.clone().renew_loop());
        tokio::time::sleep(CA_CHECK * 5).await;
        assert_eq!(cert.chain(), first, "same CA, far from half-life: not renewed");

        material.replace(Ca::generate(&TrustDomain::default()).unwrap());
        assert!(!cert.signed_by_current_ca());
        tokio::time::sleep(CA_CHECK * 2).await;
        assert_ne!(cert.chain(), first, "renewed after the CA changed");
        assert!(cert.signed_by_current_ca(), "issued by the CA in force now");
        task.abort();
    }
}
