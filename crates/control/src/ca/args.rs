//! The certificate service's flags of `slipstream control`, in one place
//! (flatten [`CaArgs`] into the command's arguments).

use super::roots::{CaFiles, CaSource};
use super::service::CaConfig;
use super::tokenreview::ReviewPolicy;
use crate::namespaced::NamespacedName;
use slipstream_core::TrustDomain;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct CaArgs {
    /// The CA's signing certificate (PEM: a root, or an intermediate under
    /// your root, optionally followed by its intermediates); with --ca-key.
    /// Without both, a root is generated in --ca-dir on first start and kept.
    #[arg(long, requires = "ca_key")]
    pub ca_cert: Option<PathBuf>,
    /// The private key of --ca-cert (PEM). It never leaves this process.
    #[arg(long, requires = "ca_cert")]
    pub ca_key: Option<PathBuf>,
    /// Intermediates from the signing certificate's issuer up to your root
    /// (which may end the file).
    #[arg(long, requires = "ca_cert")]
    pub ca_chain: Option<PathBuf>,
    /// Every root proxies should trust, concatenated (old and new during a
    /// rotation).
    #[arg(long, requires = "ca_cert")]
    pub root_bundle: Option<PathBuf>,
    /// Without --ca-cert: where a root generated on first start is kept
    /// (root-cert.pem, and root-key.pem readable by its owner only).
    #[arg(long, default_value = "/var/lib/slipstream/ca")]
    pub ca_dir: PathBuf,
    /// Kubernetes: the CA from this Secret, in Istio's `cacerts` layout
    /// (ca-cert.pem, ca-key.pem, optionally cert-chain.pem and
    /// root-cert.pem). Absent, it is created holding a generated root (the
    /// first replica to create it wins; the others read its root); present
    /// but unusable, startup fails naming the key, and it is not changed.
    #[arg(long, value_name = "NAMESPACE/NAME", conflicts_with_all = ["ca_cert", "ca_key", "ca_dir"])]
    pub ca_secret: Option<NamespacedName>,
    /// Kubernetes: publish the roots proxies must trust (PEM) in this
    /// ConfigMap, key root-cert.pem, in the namespace of --ca-secret (else
    /// POD_NAMESPACE): created if absent, written when it differs, at
    /// startup and when the roots change. The node proxies mount it as
    /// their --control-plane-root.
    #[arg(long, value_name = "NAME", value_parser = parse_configmap_name)]
    pub root_configmap: Option<String>,
    /// The longest workload certificate lifetime issued (and the default).
    #[arg(long, default_value = "24h", value_parser = parse_lifetime)]
    pub max_cert_validity: Duration,
    /// Kubernetes: service accounts (namespace/name) whose pod-bound tokens
    /// are node proxies' (TokenReview); repeatable or comma-separated.
    #[arg(long = "node-proxy-account", default_value = "istio-system/ztunnel", value_delimiter = ',')]
    pub node_proxy_accounts: Vec<String>,
    /// Kubernetes: audiences a node proxy's token must carry (TokenReview);
    /// repeatable or comma-separated.
    #[arg(long = "token-audience", default_value = "istio-ca", value_delimiter = ',')]
    pub token_audiences: Vec<String>,
}

fn parse_configmap_name(s: &str) -> Result<String, String> {
    slipstream_k8s::names::check_dns_subdomain(s).map(|()| s.to_string()).map_err(|e| format!("{s:?}: a ConfigMap name {e}"))
}

fn parse_lifetime(s: &str) -> Result<Duration, String> {
    let d = slipstream_core::duration::parse_flag(s)?;
    if d < Duration::from_secs(60) {
        return Err(format!("{s:?}: a certificate must live at least a minute"));
    }
    Ok(d)
}

impl CaArgs {
    /// Where the CA material comes from.
    pub fn source(&self) -> anyhow::Result<CaSource> {
        match (&self.ca_cert, &self.ca_key) {
            (Some(cert), Some(key)) => Ok(CaSource::Files(CaFiles {
                cert: cert.clone(),
                key: key.clone(),
                chain: self.ca_chain.clone(),
                root_bundle: self.root_bundle.clone(),
            })),
            (None, None) => Ok(CaSource::Generated { dir: self.ca_dir.clone() }),
            _ => anyhow::bail!("the CA: give both --ca-cert and --ca-key (your CA), or neither (a root generated and kept in --ca-dir)"),
        }
    }

    /// Where the roots are published (`--root-configmap`), if anywhere:
    /// the namespace is --ca-secret's, else `pod_namespace` (POD_NAMESPACE).
    pub fn root_configmap_target(&self, pod_namespace: Option<&str>) -> anyhow::Result<Option<NamespacedName>> {
        let Some(name) = &self.root_configmap else { return Ok(None) };
        let namespace = match (&self.ca_secret, pod_namespace.filter(|n| !n.is_empty())) {
            (Some(s), _) => s.namespace.clone(),
            (None, Some(ns)) => ns.to_string(),
            (None, None) => {
                anyhow::bail!("--root-configmap {name}: in which namespace? Give --ca-secret NAMESPACE/NAME or set POD_NAMESPACE")
            }
        };
        Ok(Some(NamespacedName { namespace, name: name.clone() }))
    }

    pub fn config(&self, trust_domain: TrustDomain) -> CaConfig {
        CaConfig { trust_domain, default_validity: self.max_cert_validity, max_validity: self.max_cert_validity, ..CaConfig::default() }
    }

    pub fn review_policy(&self) -> anyhow::Result<ReviewPolicy> {
        let node_proxies =
            ReviewPolicy::parse_accounts(&self.node_proxy_accounts).map_err(|e| anyhow::anyhow!("--node-proxy-account: {e}"))?;
        Ok(ReviewPolicy { node_proxies, audiences: self.token_audiences.clone(), ..ReviewPolicy::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        ca: CaArgs,
    }

    fn parse(args: &[&str]) -> Result<CaArgs, String> {
        Cmd::try_parse_from(std::iter::once("control").chain(args.iter().copied())).map(|c| c.ca).map_err(|e| e.to_string())
    }

    #[test]
    fn flags() {
        let a = parse(&["--ca-cert", "c.pem", "--ca-key", "k.pem", "--root-bundle", "roots.pem"]).unwrap();
        assert_eq!(
            a.source().unwrap(),
            CaSource::Files(CaFiles { cert: "c.pem".into(), key: "k.pem".into(), chain: None, root_bundle: Some("roots.pem".into()) })
        );
        assert_eq!(a.config(TrustDomain::default()).max_validity, Duration::from_secs(24 * 3600));
        assert_eq!(a.review_policy().unwrap(), ReviewPolicy::default());

        let g = parse(&["--ca-dir", "/var/lib/slipstream/ca", "--max-cert-validity", "12h"]).unwrap();
        assert_eq!(g.source().unwrap(), CaSource::Generated { dir: "/var/lib/slipstream/ca".into() });
        assert_eq!(g.config(TrustDomain::default()).default_validity, Duration::from_secs(12 * 3600));

        assert!(parse(&["--ca-cert", "c.pem"]).is_err(), "a certificate needs its key");
        assert!(parse(&["--ca-key", "k.pem"]).is_err(), "a key needs its certificate");
        assert!(parse(&["--max-cert-validity", "10s"]).unwrap_err().contains("at least a minute"));
        assert_eq!(parse(&[]).unwrap().source().unwrap(), CaSource::Generated { dir: "/var/lib/slipstream/ca".into() });
        let two = parse(&["--node-proxy-account", "a/b,c/d", "--token-audience", "x", "--token-audience", "y"]).unwrap();
        let policy = two.review_policy().unwrap();
        assert_eq!(policy.node_proxies, [("a".to_string(), "b".to_string()), ("c".to_string(), "d".to_string())]);
        assert_eq!(policy.audiences, ["x", "y"]);
        let bad = parse(&["--ca-dir", "d", "--node-proxy-account", "ztunnel"]).unwrap().review_policy().unwrap_err();
        assert!(bad.to_string().contains("not a service account as namespace/name"), "{bad}");
    }

    #[test]
    fn the_ca_from_a_secret_and_the_published_roots() {
        let a = parse(&["--ca-secret", "slipstream-system/slipstream-ca", "--root-configmap", "slipstream-ca-root"]).unwrap();
        assert_eq!(a.ca_secret, Some(NamespacedName::new("slipstream-system", "slipstream-ca")));
        let target = a.root_configmap_target(Some("elsewhere")).unwrap();
        assert_eq!(target, Some(NamespacedName::new("slipstream-system", "slipstream-ca-root")), "the Secret's namespace first");
        let b = parse(&["--root-configmap", "roots"]).unwrap();
        assert_eq!(b.root_configmap_target(Some("mine")).unwrap(), Some(NamespacedName::new("mine", "roots")));
        assert!(b.root_configmap_target(None).unwrap_err().to_string().contains("POD_NAMESPACE"));
        assert_eq!(parse(&[]).unwrap().root_configmap_target(Some("mine")).unwrap(), None);

        for conflicting in [["--ca-cert", "c.pem"], ["--ca-key", "k.pem"], ["--ca-dir", "d"]] {
            let e = parse(&["--ca-secret", "a/b", conflicting[0], conflicting[1]]).unwrap_err();
            assert!(e.contains("cannot be used with"), "{conflicting:?}: {e}");
        }
        assert!(parse(&["--ca-secret", "no-namespace"]).unwrap_err().contains("NAMESPACE/NAME"));
        assert!(parse(&["--root-configmap", "Bad_Name"]).is_err());
    }
}
