//! Where a proxy's certificates come from, and what it trusts.
//!
//! Two sources ([`NodeCa`]): a CA in this process (tests, and the node
//! proxy's mode without a control plane, `--ca-dir`), or the control
//! plane's certificate service ([`RemoteCa`]), in which case the proxy
//! never reads a signing key. Either way one [`SharedTrust`] holds the
//! roots the proxy trusts: the HBONE server verifies clients against it
//! and the pool verifies servers against it, at each handshake, so a new
//! root bundle applies to the next connection and never to one already
//! established.

use crate::caclient::RemoteCa;
use crate::control::{ControlChannel, ControlSettings};
use anyhow::Context;
use futures_util::future::BoxFuture;
use slipstream_core::SpiffeId;
use slipstream_hbone::CertSource;
use slipstream_identity::{Ca, CertManager, CertificateProvider, FetchError, LocalCaProvider, SharedTrust, TrustBundle, WorkloadCert};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The node proxy's certificate authority.
pub enum NodeCa {
    /// Signs here (the key is in this process).
    Local(Arc<Ca>),
    /// Asks the control plane; `roots` is the trust until its first answer.
    Remote { channel: ControlChannel, roots: TrustBundle },
}

impl From<Arc<Ca>> for NodeCa {
    fn from(ca: Arc<Ca>) -> Self {
        NodeCa::Local(ca)
    }
}

impl NodeCa {
    /// The control plane when one is configured (`control`, and the
    /// `channel` made to it), else the local CA in `ca_dir` (its
    /// `root-cert.pem` and `root-key.pem`). The node proxy's `Config`
    /// calls it with its own settings.
    pub fn new(control: Option<&ControlSettings>, channel: Option<&ControlChannel>, ca_dir: &Path) -> anyhow::Result<NodeCa> {
        match (control, channel) {
            (Some(settings), Some(channel)) => {
                let roots = TrustBundle::from_pem_file(&settings.root_cert)
                    .with_context(|| format!("reading --control-plane-root {}", settings.root_cert.display()))?;
                Ok(NodeCa::Remote { channel: channel.clone(), roots })
            }
            (Some(_), None) => anyhow::bail!("a control plane is configured but no channel to it was made"),
            (None, _) => {
                let cert = ca_dir.join("root-cert.pem");
                let key = ca_dir.join("root-key.pem");
                let ca = Ca::from_pem_files(&cert, &key, None).with_context(|| format!("loading the mesh CA from {}", ca_dir.display()))?;
                Ok(NodeCa::Local(Arc::new(ca)))
            }
        }
    }

    /// The provider the certificate manager fetches from, and the trust it
    /// keeps current.
    pub fn provider(self, validity: Duration) -> (Arc<dyn CertificateProvider>, SharedTrust) {
        match self {
            NodeCa::Local(ca) => {
                let trust = SharedTrust::new(ca.roots().clone());
                (Arc::new(LocalCaProvider::new(ca, validity)), trust)
            }
            NodeCa::Remote { channel, roots } => {
                let trust = SharedTrust::new(roots);
                (Arc::new(RemoteCa::new(channel, validity, trust.clone())), trust)
            }
        }
    }
}

/// The HBONE pool's certificates: the cached ones, checked against the
/// node's current trust rather than the bundle each came with (a
/// certificate fetched before a rotation started still carries the old
/// bundle).
pub struct TrustedCerts {
    certs: CertManager,
    trust: SharedTrust,
}

impl TrustedCerts {
    pub fn new(certs: CertManager, trust: SharedTrust) -> TrustedCerts {
        TrustedCerts { certs, trust }
    }
}

impl CertSource for TrustedCerts {
    fn fetch<'a>(&'a self, id: &'a SpiffeId) -> BoxFuture<'a, Result<Arc<WorkloadCert>, FetchError>> {
        Box::pin(async move {
            let cert = self.certs.fetch_certificate(id).await?;
            let trust = self.trust.current();
            if cert.roots() == &trust {
                Ok(cert)
            } else {
                Ok(Arc::new(cert.with_roots(trust)))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_core::TrustDomain;
    use slipstream_identity::CertManagerConfig;

    /// A certificate cached before the trust changed is checked against the
    /// new trust, without being fetched again.
    #[tokio::test]
    async fn the_pool_sees_cached_certificates_with_the_current_trust() {
        let ca = Arc::new(Ca::generate(&TrustDomain::default()).unwrap());
        let (provider, trust) = NodeCa::from(ca.clone()).provider(Duration::from_secs(600));
        let manager = CertManager::new(provider, CertManagerConfig::default());
        let pool = TrustedCerts::new(manager.clone(), trust.clone());
        let id: SpiffeId = "spiffe://cluster.local/ns/default/sa/web".parse().unwrap();
        let first = pool.fetch(&id).await.unwrap();
        assert_eq!(first.roots(), ca.roots());

        let other = Ca::generate(&TrustDomain::default()).unwrap();
        let both = TrustBundle::from_der(ca.roots().certs().iter().chain(other.roots().certs()).cloned().collect()).unwrap();
        assert!(trust.replace(&both));
        let again = pool.fetch(&id).await.unwrap();
        assert_eq!(again.serial(), first.serial(), "the same certificate");
        assert_eq!(again.roots(), &both, "checked against the node's current roots");
        assert_eq!(manager.fetch_certificate(&id).await.unwrap().roots(), ca.roots(), "the cache itself is unchanged");
    }
}
